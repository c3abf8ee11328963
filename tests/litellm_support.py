"""A real LiteLLM proxy for the provider-weather tests (tests/test_provider_weather.py), from
its own virtual environment (``.venv-litellm``, installed by ``make test``), on a free port.

What the pinned version (1.80.0) does, read in its source (litellm/proxy/hooks/
parallel_request_limiter_v3.py, router pre-call checks) and checked here:

- a key's ``rpm_limit`` is counted in a fixed window of ``LITELLM_RATE_LIMIT_WINDOW_SIZE``
  seconds that starts at the window's first request; past it the proxy answers 429 with
  ``retry-after`` equal to the whole window size (not what is left of it), and successes carry
  ``x-ratelimit-api_key-remaining-requests`` (no reset header, and not the OpenAI names);
- a deployment's ``rpm`` (with ``enable_pre_call_checks``) is counted per wall-clock minute and
  answers 429 "No deployments available" without ``retry-after``;
- keys come from a ``custom_auth`` hook (no database): ``sk-limited`` (rpm 3),
  ``sk-tiny`` (rpm 1), ``sk-free`` (no limit); any other key is 401.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import aiohttp

from tests.helpers import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
LITELLM = Path(os.environ.get("PROMPTSCHED_LITELLM", ROOT / ".venv-litellm" / "bin" / "litellm"))
WINDOW = 2  # seconds: the key limits' window (LITELLM_RATE_LIMIT_WINDOW_SIZE)
KEY_LIMIT = 3  # requests per window for sk-limited
DEPLOYMENT_RPM = 3  # requests per minute of the mock-rpm model

_AUTH = """
from fastapi import Request
from litellm.proxy._types import UserAPIKeyAuth

KEYS = {"sk-limited": KEY_LIMIT, "sk-tiny": 1, "sk-free": None}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    if api_key not in KEYS:
        raise Exception("invalid api key")
    return UserAPIKeyAuth(api_key=api_key, rpm_limit=KEYS[api_key])
""".replace("KEY_LIMIT", str(KEY_LIMIT))

_CONFIG = """
model_list:
  - model_name: mock
    litellm_params:
      model: openai/mock
      mock_response: "hello from the mock"
  - model_name: mock-rpm
    litellm_params:
      model: openai/mock-rpm
      mock_response: "hello within the minute"
      rpm: DEPLOYMENT_RPM
general_settings:
  custom_auth: auth.user_api_key_auth
router_settings:
  enable_pre_call_checks: true
""".replace("DEPLOYMENT_RPM", str(DEPLOYMENT_RPM))


class LiteLLMProxy:
    """One proxy process; ``log`` is what it printed (each request's status among it)."""

    def __init__(self, workdir: Path) -> None:
        if not LITELLM.exists():
            raise RuntimeError(
                f"no LiteLLM proxy at {LITELLM}: `make test` installs it into .venv-litellm "
                "(or set PROMPTSCHED_LITELLM)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "auth.py").write_text(_AUTH)
        (workdir / "config.yaml").write_text(_CONFIG)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = workdir / "litellm.log"
        env = {
            **os.environ,
            "LITELLM_RATE_LIMIT_WINDOW_SIZE": str(WINDOW),
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "PYTHONPATH": str(workdir),
        }
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(LITELLM), "--config", "config.yaml", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def ready(self, timeout: float = 90) -> None:
        async def live() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"the LiteLLM proxy exited: {self.log.read_text()[-2000:]}")
            try:
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"http://127.0.0.1:{self.port}/health/liveliness") as r:
                        return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(live, timeout=timeout, interval=0.25, what="the LiteLLM proxy")

    def statuses(self) -> list[int]:
        """Every answer the proxy logged, in order (uvicorn's access log)."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if '"POST /v1/chat/completions' in line or '"POST /chat/completions' in line:
                found.append(int(line.rsplit('" ', 1)[1].split()[0]))
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
