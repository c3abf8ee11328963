"""The short chaos soak (``make chaos`` runs the long one): three replicas, a few dozen
second-level schedules, every kind of fault at least once, and every invariant checked."""

from __future__ import annotations

import os

import pytest

from tests.chaos import injector, soak

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
async def test_a_short_soak_under_every_kind_of_fault_keeps_every_invariant() -> None:
    seed = {"CHAOS_SEED": os.environ.get("CHAOS_SEED", "")}
    config = soak.ChaosConfig.from_env(
        seed, seconds=20.0, schedules=40, processes=3, workers=6, gap=(1.0, 2.5),
        settle_timeout=60.0,
    )  # fmt: skip
    report = await soak.run(config)  # the seed is random unless CHAOS_SEED is set: printed
    print(report.render())
    assert set(report.faults) == set(injector.KINDS), report.faults
    assert report.ok, report.render()
    assert report.numbers["runs by status"].get("succeeded", 0) > 100
