"""The worker: claims runs, executes each attempt under a lease, and finalizes it.

- ``pool``: the WorkerPool — its slots, claiming, dispatching and draining; each claimed
  run's attempt is a task of its own.
- ``runner``: the AttemptRunner — one attempt from the claim to its queued final write: the
  executor under the timeout and cancel scope, then the write ``attempt.settle`` decides,
  its metrics and log line.
- ``prompt``: the attempt's prompt and params, templates filled in from the run's context.
- ``attempt``: ``settle``, the pure decision from an attempt's stop reason and outcome to
  its final write (succeeded, pending at a backoff, dead, cancelled, or nothing).
- ``heartbeat``: the in-flight attempts (``InFlight`` with its one ``StopReason``, owned by
  ``InFlightAttempts``), one batched lease renewal for all of them, and the fence.
- ``finalizer``: group commit of the attempts' final writes; a write Postgres refuses for its
  own values fails alone.
- ``fleet``: a provider's fleet-wide limits as this process meets them: the limited claim,
  the wait while they bind, and what each attempt reports to the provider's shared row
  (tokens, breaker).
- ``transcript``: an agent attempt's steps, written as they happen.
"""

from promptsched.roles.worker.pool import WorkerPool, default_worker_id

__all__ = ["WorkerPool", "default_worker_id"]
