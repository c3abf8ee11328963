"""The worker: claims runs, executes each attempt under a lease, and finalizes it.

- ``pool``: the WorkerPool — claiming, dispatching, executing and draining; it takes a run
  from ``running`` to its final state by queueing the write ``attempt.settle`` decides.
- ``attempt``: ``settle``, the pure decision from an attempt's stop reason and outcome to
  its final write (succeeded, pending at a backoff, dead, cancelled, or nothing).
- ``heartbeat``: the in-flight attempts (``InFlight`` with its one ``StopReason``, owned by
  ``InFlightAttempts``), one batched lease renewal for all of them, and the fence.
- ``finalizer``: group commit of the attempts' final writes.
- ``fleet``: a provider's fleet-wide limits as this process meets them: the limited claim,
  the wait while they bind, and what each attempt reports to the provider's shared row
  (tokens, breaker).
- ``transcript``: an agent attempt's steps, written as they happen.
"""

from promptsched.roles.worker.pool import WorkerPool, default_worker_id

__all__ = ["WorkerPool", "default_worker_id"]
