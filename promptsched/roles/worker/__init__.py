"""The worker: claims runs, executes each attempt under a lease, and finalizes it.

- ``pool``: the WorkerPool — claiming, dispatching and draining.
- ``heartbeat``: one batched lease renewal for every attempt in flight, and the fence.
- ``finalizer``: group commit of the attempts' final writes.
- ``transcript``: an agent attempt's steps, written as they happen.
"""

from promptsched.roles.worker.pool import WorkerPool, default_worker_id

__all__ = ["WorkerPool", "default_worker_id"]
