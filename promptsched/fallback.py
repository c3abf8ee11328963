"""A schedule's route: its own provider and model, then its fallbacks (``NAME`` or
``NAME:MODEL``) in order, and which place of it a run's next attempt goes to."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from promptsched.errors import ValidationError

MAX_FALLBACKS = 5


@dataclass(frozen=True, slots=True)
class Place:
    """One place of a route: where an attempt goes. ``model`` None: the provider's default
    (for the schedule's own place: the schedule's model)."""

    index: int
    provider: str
    model: str | None


def split(entry: str) -> tuple[str, str | None]:
    """``NAME`` or ``NAME:MODEL`` (the model may itself hold colons: ``local:llama3.1:8b``)."""
    name, sep, model = entry.partition(":")
    return name, (model if sep else None)


def route(provider: str, model: str | None, fallback: Sequence[str]) -> list[Place]:
    """The schedule's own place first, then each fallback."""
    places = [Place(0, provider, model)]
    for number, entry in enumerate(fallback, start=1):
        name, entry_model = split(entry)
        places.append(Place(number, name, entry_model))
    return places


def next_place(
    places: Sequence[Place], current: int, *, unavailable: Collection[str] = ()
) -> Place | None:
    """Where the attempt after a retryable failure or throttling at ``current`` goes: the next
    place in order (after the last, the first again) whose provider is not ``unavailable``
    (its breaker open, as this process last saw it), else simply the next; None for a route of
    one place (no fallback)."""
    if len(places) < 2:
        return None
    count = len(places)
    ahead = [places[(current + step) % count] for step in range(1, count)]
    for place in ahead:
        if place.provider not in unavailable:
            return place
    return ahead[0]


def validate(
    raw: object, *, providers: Collection[str], primary: str, field: str = "fallback"
) -> tuple[str, ...]:
    """A checked fallback list: each entry ``NAME`` or ``NAME:MODEL`` naming a configured
    provider; raises ``ValidationError`` naming ``fallback[i]``."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list | tuple):
        raise ValidationError(field, "must be a list of provider names (NAME or NAME:MODEL)")
    if len(raw) > MAX_FALLBACKS:
        raise ValidationError(field, f"at most {MAX_FALLBACKS} fallback providers")
    entries: list[str] = []
    for number, entry in enumerate(raw):
        where = f"{field}[{number}]"
        if not isinstance(entry, str) or not entry.strip():
            raise ValidationError(where, "must be a provider name, NAME or NAME:MODEL")
        name, model = split(entry.strip())
        if name not in providers:
            known = ", ".join(sorted(providers))
            raise ValidationError(where, f"unknown provider {name!r} (configured: {known})")
        if model is not None and (not model.strip() or len(model) > 200):
            raise ValidationError(where, "the model after ':' must be 1 to 200 characters")
        if entry.strip() in entries or (name == primary and model is None):
            raise ValidationError(where, f"{entry.strip()!r} is already in the route")
        entries.append(entry.strip())
    return tuple(entries)
