"""The price table of the server's providers: what a million input and output tokens cost,
per provider and optionally per model, for the cost of every attempt (docs/providers.md).

Written ``PROVIDER[:MODEL]=INPUT/OUTPUT`` entries separated by commas, e.g.
``openai:gpt-4o=2.50/10.00, openai=0.15/0.60, echo=1/1``: a model's own entry wins over its
provider's. The unit is whatever currency the operator prices in (the docs say USD); costs
are reported in that unit, per token counts the provider reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from promptsched.errors import ConfigError

_ENTRY = re.compile(
    r"^(?P<provider>[a-z][a-z0-9_]*)(?::(?P<model>[^=\s]+))?"
    r"=(?P<input>\d+(?:\.\d+)?)/(?P<output>\d+(?:\.\d+)?)$"
)
MILLION = 1_000_000
DEFAULT_MODEL = "default"  # the model a run used when its schedule and provider name none


@dataclass(frozen=True, slots=True)
class Price:
    input: float  # per million prompt tokens
    output: float  # per million completion tokens


@dataclass(frozen=True, slots=True)
class Prices:
    """``(provider, model or None) -> Price``; empty: nothing is priced."""

    table: Mapping[tuple[str, str | None], Price] = field(default_factory=dict)
    # provider -> its default model, for runs whose schedule names none
    default_models: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, name: str = "PROMPTSCHED_PRICES") -> Prices:
        table: dict[tuple[str, str | None], Price] = {}
        for raw in (part.strip() for part in text.split(",")):
            if not raw:
                continue
            match = _ENTRY.match(raw.replace(" ", ""))
            if match is None:
                raise ConfigError(
                    name,
                    f"{raw!r} is not PROVIDER[:MODEL]=INPUT/OUTPUT (prices per million tokens, "
                    "e.g. openai:gpt-4o=2.50/10)",
                )
            key = (match["provider"], match["model"])
            if key in table:
                raise ConfigError(name, f"{raw!r} prices {':'.join(filter(None, key))} twice")
            table[key] = Price(float(match["input"]), float(match["output"]))
        return cls(table)

    def with_default_models(self, models: Mapping[str, str | None]) -> Prices:
        return Prices(self.table, dict(models))

    def model(self, provider: str, model: str | None) -> str | None:
        """The model a run used: its schedule's, else its provider's default."""
        return model or self.default_models.get(provider)

    def models(self, providers: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The bounded ``model`` label values of each provider (metrics.Metrics.know): the
        models it is priced for and its default model (``default`` when it has none)."""
        known: dict[str, tuple[str, ...]] = {}
        for provider in providers:
            names = [self.default_models.get(provider) or DEFAULT_MODEL]
            names += sorted(m for p, m in self.table if p == provider and m is not None)
            known[provider] = tuple(dict.fromkeys(names))
        return known

    def price(self, provider: str, model: str | None) -> Price | None:
        model = self.model(provider, model)
        return self.table.get((provider, model)) or self.table.get((provider, None))

    def cost(self, provider: str, model: str | None, usage: Mapping[str, int]) -> float | None:
        """What the usage cost; None when the provider (and model) has no price."""
        price = self.price(provider, model)
        if price is None:
            return None
        prompt = usage.get("prompt_tokens", 0)
        completion = usage.get("completion_tokens", 0)
        return (prompt * price.input + completion * price.output) / MILLION
