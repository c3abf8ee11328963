"""The service's garbage-collection policy, applied once at startup (Supervisor.run).

Every run allocates a task, its coroutines, the claim's records and the attempt's objects, and
reference counting frees them the moment the run ends: a 64-slot drain of 5,000 no-op runs left
11 objects in cycles, the only garbage the collector exists for. But CPython starts a young
collection whenever the tracked objects grow by 700 (its default thresholds are 700, 10, 10),
and one claim of 64 runs grows them by thousands. So a drain of 40,000 runs took 1,282 young
collections, 117 middle ones and 10 full ones; each full one walks every object the process has
(modules, classes, the API's routes, the config: objects that never become garbage) and held the
event loop for 40-50 ms. Collection took 0.64-0.75 s of the process's ~3.5 s of CPU, 15-18 µs a
run.

Two remedies, both in CPython's own gc module:

* ``gc.freeze()`` once everything startup builds exists, after one full collection: those objects
  move to a permanent generation that no collection walks again. A full collection then walks
  only what the service allocated since.
* A young-generation threshold of 10,000 instead of 700 (and 20 young collections per older one
  instead of 10): a batch of claims no longer trips a collection, and the cycles that do form are
  still collected after at most 10,000 more tracked objects, a few megabytes.

Together: the same drain runs no collection at all (tests/test_processes.py counts them over
3,000 runs on 64 slots: none, against 80-90 young and 7 older ones by default), startup pays one
full collection of 30-40 ms before the roles start, and a run costs 15-18 µs less CPU.

Thousands of slow calls in flight (W9) need more: each call's objects (its task and
coroutines, the HTTP request and response, their futures and timers) live for the seconds the
call takes, so they survive young collections and pile up in the older generations, and every
middle collection walks all of them. At 2,000 calls in flight, thresholds of 10,000 and 20
took 152 young and 7 middle collections in a 20,000-run drain, about 4 s of the loop's time,
single pauses of 200-500 ms. A young threshold of 100,000 and 100 young collections per older
one: 3 young collections and no older one in the same drain, worker CPU 410 -> 309 µs a run
(one sitting, W9 at 2,000 in flight, docs/performance.md). Those calls leave no garbage in
cycles (a drain of 2,000 through the `openai` provider found 37 such objects, from the pool's
own shutdown), so collecting less often keeps nothing alive that refcounting would not free:
a cycle is still collected by the next young collection, at most 100,000 tracked objects later
(tens of megabytes at worst), and one that forms among long-lived objects by a middle one.
"""

from __future__ import annotations

import gc

YOUNG = 100_000
OLDER = 100


def settle() -> int:
    """Collect once, freeze what survives, and raise the thresholds; the number of objects
    frozen (the process's ``supervisor.ready`` line says it as ``heap_frozen``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, OLDER, OLDER)
    return gc.get_freeze_count()
