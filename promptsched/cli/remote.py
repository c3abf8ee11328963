"""Remote mode: where the service is (flags, ``PROMPTSCHED_URL``/``PROMPTSCHED_TOKEN``, or a
``cli.toml`` only its owner can read) and the backend that goes through its HTTP API, acting
as the token's owner with the token's rights."""

from __future__ import annotations

import errno
import json
import stat
import tomllib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import anyio

from promptsched.cli.common import EXIT_BAD_INPUT, EXIT_NOT_FOUND, EXIT_OTHER, CliError

URL_ENV, TOKEN_ENV = "PROMPTSCHED_URL", "PROMPTSCHED_TOKEN"
PAGE = 200  # the API's largest page
CONCURRENT_LOOKUPS = 8
TIMEOUT = aiohttp.ClientTimeout(total=60)
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    token: str


def config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "promptsched" / "cli.toml"


def _read_file(path: Path) -> dict[str, str]:
    """``url`` and ``token`` from the file; refused when others may read it (it holds a
    token) or when it is not a plain file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}
    if not stat.S_ISREG(info.st_mode):
        raise CliError(f"{path}: not a regular file")
    if info.st_mode & 0o077:
        raise CliError(
            f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}) and holds a "
            f"token; refusing to use it: run chmod 600 {path}",
            EXIT_OTHER,
        )
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"{path}: {exc}", EXIT_OTHER) from None
    unknown = sorted(set(data) - {"url", "token"})
    if unknown:
        raise CliError(f"{path}: unknown key {unknown[0]!r} (known: url, token)", EXIT_OTHER)
    if not all(isinstance(v, str) for v in data.values()):
        raise CliError(f"{path}: url and token must be strings", EXIT_OTHER)
    return dict(data)


def target(flag_url: str | None, flag_token: str | None, env: Mapping[str, str]) -> Target | None:
    """The service to talk to, or None for direct mode. Each of url and token comes from its
    flag, else its environment variable, else the config file."""
    url = flag_url or env.get(URL_ENV) or None
    token = flag_token or env.get(TOKEN_ENV) or None
    if url is None or token is None:
        found = _read_file(config_path(env))
        url, token = url or found.get("url"), token or found.get("token")
    if url is None and token is None:
        return None
    if url is None:
        raise CliError(f"a token but no service URL: set {URL_ENV} or pass --url")
    if token is None:
        raise CliError(f"a service URL but no token: set {TOKEN_ENV} or pass --token")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"--url: must start with http:// or https://, got {url[:60]!r}")
    # The API's routes are under /v1 of the base address; a URL given with it means the same.
    return Target(url.rstrip("/").removesuffix("/v1"), token.strip())


NOT_API = "the server answered HTTP {status} without an API error"


class ApiProblem(CliError):
    """An error answer of the API, worded as the API words it."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            field, message = error.get("field"), str(error.get("message"))
        else:  # not the API's own answer: a proxy or another server
            field, message = None, NOT_API.format(status=status)
        text = f"{field}: {message}" if field else message
        code = {400: EXIT_BAD_INPUT, 422: EXIT_BAD_INPUT, 404: EXIT_NOT_FOUND}.get(status)
        super().__init__(text, code or EXIT_OTHER)
        self.status = status
        # The API names what it did not find ("schedule 7 not found"); a bare "Not Found",
        # or another server's page, means no such route.
        self.route_unknown = status == 404 and (
            not isinstance(error, dict) or message == "Not Found"
        )


def _connect_words(exc: aiohttp.ClientError) -> str:
    """A connection failure in words of our own (aiohttp's quote its internals)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "no such host"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate is not trusted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed (is it https at all?)"
    if isinstance(exc, aiohttp.ClientConnectorError):
        refused = exc.os_error.errno == errno.ECONNREFUSED
        return "nothing listens there (connection refused)" if refused else "no connection"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientConnectionResetError):
        return "the connection was closed before an answer came"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the answer broke off"
    return "a network error"


def unreachable(url: str, exc: aiohttp.ClientError, what: str = "cannot reach") -> CliError:
    """The service cannot be reached: why, and what to check."""
    return CliError(
        f"{what} {url}: {_connect_words(exc)}; is the service running, and is {URL_ENV} (or "
        "--url) its address?",
        EXIT_OTHER,
    )


def _explained(problem: ApiProblem, url: str, path: str) -> ApiProblem:
    """A 404 for a route (not for a resource) means the URL does not lead to the API."""
    if problem.status == 404 and problem.route_unknown:
        problem.args = (
            f"{url}{path} is not a promptsched API route: {URL_ENV} (or --url) must be the "
            "service's base address, e.g. http://127.0.0.1:8080 (without /v1)",
        )
    return problem


def _json(text: str) -> Any:
    """A JSON body; None for an empty or malformed one (a proxy's error page, say)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _path_id(value: int) -> str:
    return quote(str(int(value)))


class RemoteBackend:
    """The CLI's operations over ``/v1``; each returns the API's JSON."""

    def __init__(self, where: Target) -> None:
        self.where = where
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RemoteBackend:
        self._session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.where.token}"}, timeout=TIMEOUT
        )
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use the backend as an async context manager"
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        return (await self.call_with_status(method, path, params=params, body=body))[1]

    async def call_with_status(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> tuple[int, Any]:
        query = {k: str(v).lower() if isinstance(v, bool) else str(v)
                 for k, v in (params or {}).items() if v is not None}  # fmt: skip
        try:
            async with self.session.request(
                method, self.where.url + path, params=query, json=body
            ) as response:
                text = await response.text()
                data = _json(text) if response.content_type == "application/json" else None
                if response.status >= 400:
                    raise ApiProblem(response.status, data)
                return response.status, data
        except ApiProblem as exc:
            raise _explained(exc, self.where.url, path) from None
        except aiohttp.ClientError as exc:
            raise unreachable(self.where.url, exc) from None
        except TimeoutError:
            raise CliError(
                f"{self.where.url} did not answer within {TIMEOUT.total:.0f} s", EXIT_OTHER
            ) from None

    async def _pages(
        self, path: str, params: Mapping[str, Any], limit: int
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while len(items) < limit:
            page = await self.call(
                "GET", path, params={**params, "limit": min(PAGE, limit - len(items)),
                                     "cursor": cursor},
            )  # fmt: skip
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        return items[:limit]

    # Schedules
    async def create_schedule(self, body: dict[str, Any], owner: str | None) -> dict[str, Any]:
        del owner  # the token's owner
        data: dict[str, Any] = await self.call("POST", "/v1/schedules", body=body)
        return data

    async def list_schedules(
        self, *, owner: str | None, name: str | None, limit: int
    ) -> list[dict[str, Any]]:
        return await self._pages("/v1/schedules", {"owner": owner, "name": name}, limit)

    async def get_schedule(self, schedule_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("GET", f"/v1/schedules/{_path_id(schedule_id)}")
        return data

    async def schedule_names(self, ids: list[int]) -> dict[int, tuple[str, str]]:
        """A few lookups at a time; one that fails (deleted meanwhile) is left out."""
        found: dict[int, tuple[str, str]] = {}
        limit = anyio.Semaphore(CONCURRENT_LOOKUPS)

        async def one(schedule_id: int) -> None:
            async with limit:
                try:
                    data = await self.get_schedule(schedule_id)
                except CliError:
                    return
            found[schedule_id] = (data["name"], data["timezone"])

        async with anyio.create_task_group() as tg:
            for schedule_id in ids:
                tg.start_soon(one, schedule_id)
        return found

    async def update_schedule(
        self, schedule_id: int, patch: dict[str, Any], version: int | None
    ) -> dict[str, Any]:
        body = {**patch, "version": version} if version is not None else patch
        path = f"/v1/schedules/{_path_id(schedule_id)}"
        data: dict[str, Any] = await self.call("PATCH", path, body=body)
        return data

    async def pause_schedule(
        self, schedule_id: int, until: str | None, reason: str | None
    ) -> dict[str, Any]:
        body = {k: v for k, v in (("until", until), ("reason", reason)) if v is not None}
        path = f"/v1/schedules/{_path_id(schedule_id)}/pause"
        data: dict[str, Any] = await self.call("POST", path, body=body)
        return data

    async def resume_schedule(self, schedule_id: int) -> dict[str, Any]:
        path = f"/v1/schedules/{_path_id(schedule_id)}/resume"
        data: dict[str, Any] = await self.call("POST", path)
        return data

    async def trigger_schedule(self, schedule_id: int) -> dict[str, Any]:
        path = f"/v1/schedules/{_path_id(schedule_id)}/trigger"
        data: dict[str, Any] = await self.call("POST", path)
        return data

    async def backfill_schedule(self, schedule_id: int, start: str, end: str) -> dict[str, Any]:
        path = f"/v1/schedules/{_path_id(schedule_id)}/backfill"
        data: dict[str, Any] = await self.call("POST", path, body={"start": start, "end": end})
        return data

    async def delete_schedule(self, schedule_id: int) -> None:
        await self.call("DELETE", f"/v1/schedules/{_path_id(schedule_id)}")

    async def schedule_history(self, schedule_id: int, limit: int) -> list[dict[str, Any]]:
        return await self._pages(f"/v1/schedules/{_path_id(schedule_id)}/history", {}, limit)

    async def explain(self, schedule_id: int, at: str) -> dict[str, Any]:
        path = f"/v1/schedules/{_path_id(schedule_id)}/explain"
        data: dict[str, Any] = await self.call("GET", path, params={"at": at})
        return data

    # Runs
    async def list_runs(
        self, *, schedule_id: int | None, status: str | None, limit: int
    ) -> list[dict[str, Any]]:
        if schedule_id is None:
            return await self._pages("/v1/runs", {"status": status}, limit)
        path = f"/v1/schedules/{_path_id(schedule_id)}/runs"  # a 404 unless it is yours
        return await self._pages(path, {"status": status}, limit)

    async def get_run(self, run_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("GET", f"/v1/runs/{_path_id(run_id)}")
        return data

    async def diff_runs(self, run_id: int, other_id: int) -> dict[str, Any]:
        path = f"/v1/runs/{_path_id(run_id)}/diff/{_path_id(other_id)}"
        data: dict[str, Any] = await self.call("GET", path)
        return data

    async def cancel_run(self, run_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("POST", f"/v1/runs/{_path_id(run_id)}/cancel")
        return data

    async def replay_run(self, run_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("POST", f"/v1/runs/{_path_id(run_id)}/replay")
        return data

    async def watch(self, run_id: int) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """The run's event stream: ``("subscribed", {})`` once listening, then ``progress``
        and ``gap`` events, and ``done`` at the end (reconnecting when the server ends a
        long stream without it)."""
        url = f"{self.where.url}/v1/runs/{_path_id(run_id)}/events"
        first = True
        while True:
            try:
                async with self.session.get(url, timeout=STREAM_TIMEOUT) as response:
                    if response.status >= 400:
                        raise ApiProblem(response.status, _json(await response.text()))
                    if first:
                        first = False
                        yield "subscribed", {}
                    async for kind, data in _events(response):
                        if kind == "revoked":  # the token was revoked while watching
                            raise CliError(f"the event stream ended: {data.get('reason')}")
                        yield kind, data
                        if kind == "done":
                            return
            except aiohttp.ClientError as exc:
                raise unreachable(self.where.url, exc, "the event stream broke") from None

    # Notifications and preview
    async def dead_notifications(self, limit: int) -> list[dict[str, Any]]:
        return await self._pages("/v1/notifications/dead", {}, limit)

    async def replay_notification(self, notification_id: int) -> dict[str, Any]:
        path = f"/v1/notifications/{_path_id(notification_id)}/replay"
        data: dict[str, Any] = await self.call("POST", path)
        return data

    async def preview(self, query: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("GET", "/v1/preview", params=query)
        return data

    # Follow-ups: the token's owner's; an admin token reaches another owner's with --owner.
    async def create_followup(
        self, body: dict[str, Any], owner: str | None
    ) -> tuple[bool, dict[str, Any]]:
        del owner
        status, data = await self.call_with_status("POST", "/v1/followups", body=body)
        return status == 201, data

    async def get_followup(self, key: str, owner: str | None) -> dict[str, Any]:
        path = f"/v1/followups/{quote(key, safe='')}"
        data: dict[str, Any] = await self.call("GET", path, params={"owner": owner})
        return data

    async def cancel_followup(self, key: str, owner: str | None) -> None:
        path = f"/v1/followups/{quote(key, safe='')}"
        await self.call("DELETE", path, params={"owner": owner})

    async def list_followup_runs(
        self, key: str, *, status: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]:
        path = f"/v1/followups/{quote(key, safe='')}/runs"  # a 404 unless it is yours
        return await self._pages(path, {"status": status, "owner": owner}, limit)

    async def list_followups(
        self, state: str | None, limit: int, owner: str | None
    ) -> list[dict[str, Any]]:
        return await self._pages("/v1/followups", {"state": state, "owner": owner}, limit)

    async def get_budget(self, owner: str | None) -> dict[str, Any]:
        query = {"owner": owner} if owner else None
        data: dict[str, Any] = await self.call("GET", "/v1/budget", params=query)
        return data

    async def set_budget(self, owner: str | None, budget: dict[str, Any]) -> dict[str, Any]:
        query = {"owner": owner} if owner else None
        data: dict[str, Any] = await self.call("PUT", "/v1/budget", params=query, body=budget)
        return data

    async def status(self) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("GET", "/v1/status")
        return data

    async def idle(self) -> bool:
        return False  # the service answering is a running replica

    async def doctor(self) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("GET", "/v1/doctor")
        return data


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Server-Sent Events as (event, data); comments and retry lines are skipped."""
    kind, data = "", ""
    async for raw in response.content:
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not line:
            if kind:
                try:
                    payload = json.loads(data) if data else {}
                except ValueError:
                    payload = {"text": data}
                yield kind, payload if isinstance(payload, dict) else {"value": payload}
            kind, data = "", ""
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "data":
                data = f"{data}\n{value}" if data else value
