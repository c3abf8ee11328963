"""``make bench``: run the workloads on an embedded Postgres of their own and write the results
table (Markdown and JSON) under bench/results/.

``BENCH_ONLY=w1,w3`` picks workloads; ``BENCH_REPEAT`` (default 3) repeats the short ones
(W1, W2, W6) and reports the median of each figure (W9: ``BENCH_W9_REPEAT``, default 2);
``BENCH_SCALE=large`` runs the rush with 100,000 schedules and the scale check with 1,000,000
schedules and 10,000,000 runs.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common

RESULTS = Path(__file__).resolve().parent / "results"
WORKLOADS = {
    "w1": "w1_claims",
    "w2": "w2_rush",
    "w3": "w3_precision",
    "w4": "w4_recovery",
    "w5": "w5_footprint",
    "w6": "w6_fire_times",
    "w7": "w7_scale",
    "w8": "w8_hostile",
    "w9": "w9_slow_calls",
}
REPEATED = {"w1", "w2", "w6", "w9"}


def _selected() -> list[str]:
    only = {part.strip() for part in os.environ.get("BENCH_ONLY", "").split(",") if part.strip()}
    unknown = only - set(WORKLOADS)
    if unknown:
        raise SystemExit(
            f"BENCH_ONLY: unknown workloads {sorted(unknown)}; known: {list(WORKLOADS)}"
        )
    return [name for name in WORKLOADS if not only or name in only]


def _median(samples: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        merged[key] = statistics.median(values) if numeric else values[0]
    if len(samples) > 1:
        merged["repetitions"] = len(samples)
    return merged


async def _one(name: str, embedded: Any, workdir: Path) -> dict[str, Any]:
    module = importlib.import_module(f"bench.{WORKLOADS[name]}")
    if name == "w6":
        return dict(module.measure(float(os.environ.get("BENCH_W6_SECONDS", "3"))))
    return dict(await module.run(embedded, workdir))


async def _run_all(selected: list[str]) -> dict[str, Any]:
    repeat = max(1, int(os.environ.get("BENCH_REPEAT", "3")))
    workdir = Path(tempfile.mkdtemp(prefix="psb-logs-"))
    results: dict[str, Any] = {}
    with common.server() as embedded:
        for name in selected:
            times = repeat if name in REPEATED else 1
            if name == "w9":  # minutes a round: two rounds, their medians
                times = max(1, int(os.environ.get("BENCH_W9_REPEAT", "2")))
            samples = []
            for _ in range(times):
                samples.append(await _one(name, embedded, workdir))
                print(f"{name}: {json.dumps(samples[-1])}", flush=True)
            results[name] = _median(samples)
            print(f"{name}: done ({times}x)", flush=True)
    return results


def _markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"# promptsched benchmark results ({meta['date']})",
        "",
        f"Machine: {meta['machine']}, {meta['cpus']} CPUs; fsync and synchronous_commit "
        f"{meta.get('fsync', 'off')}. Absolute figures drift on a shared "
        "machine; compare the ratios to the bare-SQL baselines measured in the same run. "
        "Figures of repeated workloads are medians.",
        "",
    ]
    for workload, figures in results.items():
        lines += [f"## {workload}", "", "| figure | value |", "| --- | --- |"]
        for key, value in figures.items():
            shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
            lines.append(f"| {key} | {shown} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    selected = _selected()
    results = asyncio.run(_run_all(selected))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "fsync": "on" if common.fsync_on() else "off",
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    # The headline is fsync on (results.*); BENCH_FSYNC=off writes results-fsync-off.*.
    stem = "results" if common.fsync_on() else "results-fsync-off"
    # A partial run (BENCH_ONLY) updates its workloads and keeps the others' last figures.
    previous = RESULTS / f"{stem}.json"
    if previous.exists() and os.environ.get("BENCH_ONLY"):
        results = {**json.loads(previous.read_text()).get("results", {}), **results}
    results = dict(sorted(results.items()))
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    (RESULTS / f"{stem}.md").write_text(_markdown(results, meta))
    print(_markdown(results, meta))


if __name__ == "__main__":
    main()
