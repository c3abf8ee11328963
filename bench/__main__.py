"""``make bench``: run the workloads on an embedded Postgres of their own and write the results
table (Markdown and JSON) under bench/results/. Select workloads with ``BENCH_ONLY=w3,w6``."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common, w3_precision, w6_fire_times

RESULTS = Path(__file__).resolve().parent / "results"


def _selected() -> set[str]:
    only = os.environ.get("BENCH_ONLY", "")
    return {part.strip() for part in only.split(",") if part.strip()} or {
        "w1",
        "w2",
        "w3",
        "w4",
        "w5",
        "w6",
    }


async def _run_all(selected: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    if "w6" in selected:
        results["w6"] = w6_fire_times.measure(float(os.environ.get("BENCH_W6_SECONDS", "3")))
    workdir = Path(tempfile.mkdtemp(prefix="psb-logs-"))
    with common.server() as embedded:
        if "w1" in selected:
            from bench import w1_claims

            results["w1"] = await w1_claims.run(embedded, workdir)
        if "w2" in selected:
            from bench import w2_rush

            results["w2"] = await w2_rush.run(embedded, workdir)
        if "w3" in selected:
            results["w3"] = await w3_precision.run(embedded, workdir)
        if "w4" in selected:
            from bench import w4_recovery

            results["w4"] = await w4_recovery.run(embedded, workdir)
        if "w7" in selected:
            from bench import w7_scale

            results["w7"] = await w7_scale.run(embedded, workdir)
        if "w5" in selected:
            from bench import w5_footprint

            results["w5"] = await w5_footprint.run(embedded, workdir)
    return results


def _markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"# promptsched benchmark results ({meta['date']})",
        "",
        f"Machine: {meta['machine']}, {meta['cpus']} CPUs. Absolute figures drift on a "
        "shared machine; compare the ratios to the bare-SQL baselines.",
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
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    # A partial run (BENCH_ONLY) updates its workloads and keeps the others' last figures.
    previous = RESULTS / "results.json"
    if previous.exists() and os.environ.get("BENCH_ONLY"):
        results = {**json.loads(previous.read_text()).get("results", {}), **results}
    results = dict(sorted(results.items()))
    (RESULTS / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    (RESULTS / "results.md").write_text(_markdown(results, meta))
    print(_markdown(results, meta))


if __name__ == "__main__":
    main()
