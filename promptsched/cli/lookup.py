"""Schedules as the CLI names them: a reference given as an id or a name resolved to one
schedule (or refused, naming the candidates), and the names and zones of the schedules a list
of runs belongs to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from promptsched.cli.backend import Backend


@dataclass(frozen=True, slots=True)
class Named:
    id: int
    name: str | None  # None: deleted meanwhile
    timezone: str

    @property
    def words(self) -> str:
        """``#3 weekly``: the id and the name beside it."""
        return f"#{self.id} {self.name}" if self.name is not None else f"#{self.id}"


async def names(api: Backend, ids: Iterable[int]) -> dict[int, Named]:
    """The name and zone of each schedule (a deleted one: no name, UTC)."""
    wanted = sorted(set(ids))
    found = await api.schedule_names(wanted)
    return {i: Named(i, *found[i]) if i in found else Named(i, None, "UTC") for i in wanted}
