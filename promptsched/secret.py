"""A wrapper for secret strings (API keys) that never shows its value in reprs, logs or errors."""

from __future__ import annotations

import hmac
from typing import NoReturn

_MASK = "********"


class Secret:
    """Holds a secret string; ``str``/``repr``/formatting print a mask, ``reveal()`` returns it.

    Use ``reveal()`` only at the moment the value goes on the wire (e.g. building an
    ``Authorization`` header); keep the ``Secret`` everywhere else.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("Secret wraps a str")
        self._value = value

    def reveal(self) -> str:
        """The secret value itself."""
        return self._value

    def redact(self, text: str) -> str:
        """``text`` with every occurrence of the secret replaced by a mask.

        For text that came from outside (a provider's error body may echo the key back).
        """
        if not self._value:
            return text
        return text.replace(self._value, _MASK)

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    def __str__(self) -> str:
        return _MASK

    def __format__(self, format_spec: str) -> str:
        return format(_MASK, format_spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __copy__(self) -> Secret:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, object]) -> Secret:
        return self

    def __reduce__(self) -> NoReturn:
        # Pickling would write the value somewhere we do not control.
        raise TypeError("a Secret cannot be pickled")
