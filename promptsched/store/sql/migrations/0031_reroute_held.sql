-- The schedules that name a fallback provider, for run_reroute_held: while a provider's
-- breaker is open (or its headers paced it), its waiting runs of these schedules move on to
-- their next fallback. The move reads this index, then each such schedule's waiting runs
-- through runs_unfinished_idx: it costs what those runs do, never a scan of runs.
CREATE INDEX schedules_fallback_idx ON schedules (id) WHERE cardinality(fallback) > 0;
