"""What a follow-up's check decided (docs/followups.md): "check again at/in X", or done.

A check answers with a JSON object: the webhook provider's response body, or an agent's (any
run's) final output, whole or as its last fenced ```json block::

    {"recheck_in": "6h"}            # check again in 6 hours (a duration: 30s, 15m, 6h, 1d)
    {"recheck_at": "2026-03-03T09:00:00Z"}   # check again at that instant (with its offset)

Anything else means done. A recheck whose value cannot be read is recorded as ``invalid`` (the
follow-up ends, saying why) rather than guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from promptsched.durations import parse_duration
from promptsched.errors import ValidationError

KEYS = ("recheck_in", "recheck_at")
_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def _object(output: str) -> Mapping[str, Any] | None:
    text = output.strip()
    candidates = [text] if text.startswith("{") else []
    candidates += reversed(_FENCED.findall(output))
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def read(answer: Mapping[str, Any] | None, output: str | None) -> dict[str, Any] | None:
    """The decision as ``followup_record`` takes it: ``{"recheck_in": seconds}``,
    ``{"recheck_at": ISO}``, ``{"error": why, ...}`` for an unreadable recheck, or None (done).
    ``answer`` is the provider's structured response when it has one (the webhook provider's
    JSON body), else the output is read."""
    found = answer if answer and any(k in answer for k in KEYS) else _object(output or "")
    if not found or not any(k in found for k in KEYS):
        return None
    try:
        if found.get("recheck_at") is not None:
            at = datetime.fromisoformat(str(found["recheck_at"]))
            if at.tzinfo is None:
                raise ValidationError("recheck_at", "needs a UTC offset")
            return {"recheck_at": at.isoformat()}
        seconds = parse_duration(str(found.get("recheck_in")), field="recheck_in").total_seconds()
        return {"recheck_in": seconds}
    except (ValidationError, ValueError) as exc:
        return {"error": str(exc)[:300], **{k: str(found.get(k))[:100] for k in KEYS if k in found}}
