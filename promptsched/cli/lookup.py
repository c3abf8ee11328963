"""Schedules as the CLI names them: a reference given as an id or a name resolved to one
schedule (or refused, naming the candidates), and the names and zones of the schedules a list
of runs belongs to. Names are unique per owner (migration 0032); an operator in direct mode
sees every owner's, so a name two owners use needs ``--owner`` or the id."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from promptsched.cli.backend import Backend
from promptsched.cli.common import EXIT_NOT_FOUND, CliError

MAX_MATCHES = 10_000  # names containing the one asked for, read to find it exactly


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


async def schedule_id(api: Backend, ref: str, owner: str | None = None) -> int:
    """The schedule a reference means: a number is its id; anything else its name, which
    must name exactly one schedule the caller sees (an operator sees every owner's, where two
    owners may use one name: then ``--owner`` or the id says which)."""
    text = ref.strip()
    if text.isdigit():
        return int(text)
    found = [s for s in await api.list_schedules(owner=owner, name=text, limit=MAX_MATCHES)
             if s["name"] == text]  # fmt: skip
    if len(found) == 1:
        return int(found[0]["id"])
    if not found:
        raise CliError(
            f"no schedule is named {text!r}: promptsched schedules list shows the names",
            EXIT_NOT_FOUND,
        )
    candidates = ", ".join(f"#{s['id']} (owner {s['owner']})" for s in found[:10])
    raise CliError(f"{len(found)} schedules are named {text!r}: {candidates}; give the id")
