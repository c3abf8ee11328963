"""Roles: the scheduler, workers, heartbeat, reaper and notifier, each a plain object."""
