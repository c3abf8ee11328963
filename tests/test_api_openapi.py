"""The OpenAPI document matches the handlers: every route is documented and every documented
route exists, the schemas are valid, and a schemathesis run against a real server finds no
5xx and no response outside the document."""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import asyncpg
import jsonschema
import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi import checks

from promptsched.api import app as api_app
from promptsched.clock import Clock
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.store import pool as pools
from promptsched.web import auth
from promptsched.web.progress import ProgressHub
from tests import factories
from tests.api_support import DOCUMENT, SCHEDULE

FUZZ_CHECKS = [
    not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
    checks.negative_data_rejection,
]


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    app = api_app.build(None, Metrics(), lambda: True, mounts=(console_routes.mount,))  # type: ignore[arg-type]
    routes = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None
        and not (route.resource.name or "").startswith("console.")  # HTML pages, not the API
    }
    documented = {
        (method.upper(), path) for path, item in DOCUMENT["paths"].items() for method in item
    }
    assert routes == documented


def test_the_schemas_are_valid_and_every_reference_resolves() -> None:
    names = set(DOCUMENT["components"]["schemas"])
    for name, schema in DOCUMENT["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert name[0].isupper()
    text = str(DOCUMENT)
    for ref in set(text.split("'#/components/schemas/")[1:]):
        assert ref.split("'")[0] in names
    operation_ids = [
        op["operationId"] for item in DOCUMENT["paths"].values() for op in item.values()
    ]
    assert len(operation_ids) == len(set(operation_ids))
    for item in DOCUMENT["paths"].values():
        for operation in item.values():
            assert operation["summary"] and operation["responses"]
            assert "5XX" in operation["responses"]


class ServerThread:
    """The real app on a real port, in a thread with its own event loop and pool, so a
    synchronous client (schemathesis uses requests) can call it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0

    def run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=60)

    async def _start(self) -> None:
        self.pool = await pools.create_pool(self.dsn, max_size=5)
        # Run event streams end after 0.2s here: a fuzzed request must not wait for a run.
        streams = ProgressHub(max_stream=0.2, poll=0.05)
        app = api_app.build(
            self.pool,
            Metrics(),
            lambda: True,
            providers=("echo",),
            progress=streams,
            mounts=(console_routes.mount,),
        )
        self.runner = web.AppRunner(app, handle_signals=False, **api_app.RUNNER_OPTIONS)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.pool.close()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


async def _seed(pool: asyncpg.Pool[Any]) -> str:
    """A token, and resources with small ids, so generated ids often hit real rows."""
    token, _ = await auth.create_token(pool, owner="fuzz")
    other, _ = await auth.create_token(pool, owner="other")
    from tests import api_support

    async with api_support.client(pool) as api:
        who = {"Authorization": f"Bearer {token}"}
        for i in range(3):
            await api.post("/v1/schedules", who, json={**SCHEDULE, "name": f"s{i}"})
        await api.post(
            "/v1/schedules",
            who,
            json={**SCHEDULE, "max_attempts": 1, "params": {"fail_attempts": 1}},
        )
        for sid in (1, 2, 4):
            await api.post(f"/v1/schedules/{sid}/trigger", who)
        await factories.worker_pool(pool, Clock()).run_once()
        await api.post(f"/v1/schedules/{1}/trigger", who)
        await api.post("/v1/schedules", {"Authorization": f"Bearer {other}"}, json=SCHEDULE)
    return token


@pytest.fixture
def server(dsn: str) -> Iterator[ServerThread]:
    with ServerThread(dsn) as running:
        yield running


def test_schemathesis_finds_no_server_error_and_no_undocumented_response(
    server: ServerThread,
) -> None:
    token = server.run(_seed(server.pool))
    schema = schemathesis.openapi.from_dict(DOCUMENT)
    # The token is ours to send (a valid one, below); 401s are covered in test_api_auth.py.
    schema.config.generation.update(with_security_parameters=False)
    base_url = f"http://127.0.0.1:{server.port}"
    headers = {"Authorization": f"Bearer {token}"}
    session = requests.Session()
    failures: list[str] = []
    seen: Counter[int] = Counter()
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        spec = DOCUMENT["paths"][operation.path][operation.method.lower()]
        modes = [schemathesis.GenerationMode.POSITIVE]
        if "parameters" in spec or "requestBody" in spec:  # else there is nothing to negate
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:

            @settings(
                max_examples=25,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case) -> None:
                response = case.call(base_url=base_url, session=session, headers=headers)
                seen[response.status_code // 100] += 1
                if response.status_code == 413:  # a rejection schemathesis does not list
                    sent = response.request.body or b""
                    assert len(sent) > api_app.MAX_BODY, len(sent)
                    assert response.json()["error"]["code"] == "too_large"
                    return
                case.validate_response(response, checks=FUZZ_CHECKS, headers=headers)

            try:
                fuzz()
            except Exception as exc:  # collect every operation's failure, then report them all
                failures.append(f"{operation.label} [{mode}]: {exc}"[:3000])
    print(f"schemathesis: {sum(seen.values())} requests in {time.monotonic() - started:.1f}s")
    assert not failures, "\n\n".join(failures)
    assert seen[2] > 50 and seen[4] > 100 and set(seen) == {2, 4}, seen  # real work, no 5xx


def test_the_api_never_imports_roles_or_the_supervisor() -> None:
    root = Path(api_app.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                assert not name.startswith(("promptsched.roles", "promptsched.supervisor")), path
