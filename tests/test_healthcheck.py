"""``promptsched healthcheck`` (the image's HEALTHCHECK) follows the port the service really
serves, whatever set it, and says unhealthy once the service is gone; the default worker id is
unique per process."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from promptsched.ops import serving
from tests.helpers import Service, free_port, run_cli


async def test_healthcheck_follows_the_port_the_service_serves(dsn: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    decoy = free_port()  # what this shell's own setting names: nothing listens there
    service = Service(
        dsn,
        tmp_path / "service.log",
        env={"PROMPTSCHED_DATA_DIR": str(data_dir)},
        args=("--http-port", str(port), "--workers", "1"),
    )
    shell = {"PROMPTSCHED_DATA_DIR": str(data_dir), "PROMPTSCHED_HTTP_PORT": str(decoy)}
    try:
        await service.ready()
        (entry,) = serving.announced(data_dir)
        assert entry.pid == service.pid and entry.url == f"http://127.0.0.1:{port}"
        healthy = run_cli("healthcheck", env=shell)
        assert healthy.returncode == 0, healthy.stderr
        assert f"http://127.0.0.1:{port}" in healthy.stdout
        # Stopped (SIGSTOP): the process is alive but does not answer within the timeout.
        service.signal(signal.SIGSTOP)
        frozen = run_cli("healthcheck", "--timeout", "0.5", env=shell)
        assert frozen.returncode == 1 and "unhealthy" in frozen.stderr, frozen
        service.signal(signal.SIGCONT)
    finally:
        assert service.stop() == 0
    # A clean stop withdraws the announcement: the check falls back to this shell's port.
    assert serving.announced(data_dir) == []
    gone = run_cli("healthcheck", env=shell)
    assert gone.returncode == 1
    assert f"http://127.0.0.1:{decoy}/healthz did not answer" in gone.stderr


def test_a_killed_services_announcement_is_not_believed(tmp_path: Path) -> None:
    folder = tmp_path / serving.FOLDER
    folder.mkdir()
    # A pid that cannot be alive (above the kernel's pid_max).
    (folder / "4194305.json").write_text('{"pid": 4194305, "url": "http://127.0.0.1:1"}')
    (folder / "broken.json").write_text("{not json")
    assert serving.announced(tmp_path) == []


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:80"), ("::", "http://[::1]:80"),
    ("10.1.2.3", "http://10.1.2.3:80"), ("::1", "http://[::1]:80"),
])  # fmt: skip
def test_a_bind_to_every_address_is_reached_on_loopback(host: str, url: str) -> None:
    assert serving.local_url(host, 80) == url


async def test_two_processes_on_one_host_get_different_worker_ids(dsn: str, tmp_path: Path) -> None:
    services = [Service(dsn, tmp_path / f"s{i}.log", args=("--workers", "1")) for i in range(2)]
    try:
        ids = [(await s.ready())["worker_id"] for s in services]
    finally:
        for s in services:
            s.stop()
    assert ids[0] != ids[1]
    for worker_id, s in zip(ids, services, strict=True):
        # host:random:pid — the random part keeps two containers' pid 1 apart on one host.
        assert re.fullmatch(rf"[^:]+:[0-9a-f]{{6}}:{s.pid}", worker_id), worker_id


async def test_the_worker_id_setting_wins(dsn: str, tmp_path: Path) -> None:
    service = Service(dsn, tmp_path / "s.log", env={"PROMPTSCHED_WORKER_ID": "blue-7"})
    try:
        assert (await service.ready())["worker_id"] == "blue-7"
    finally:
        service.stop()
