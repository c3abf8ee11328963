"""``python -m tests.chaos`` (``make chaos``): the default-size soak; prints the fault counts and
the invariant table, and exits non-zero when any invariant was violated.

Sizes come from the environment: CHAOS_SECONDS (150), CHAOS_SCHEDULES (200), CHAOS_PROCESSES
(3), CHAOS_WORKERS (8), CHAOS_SEED (random, printed: rerun a failure with it), CHAOS_KEEP (a
directory to keep logs and data in; a failed run keeps them in its temporary directory).
"""

from __future__ import annotations

import sys

import anyio

from tests.chaos import soak


def main() -> int:
    config = soak.ChaosConfig.from_env()
    report = anyio.run(soak.run, config)
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
