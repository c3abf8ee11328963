-- name: run_latest_finished_many
-- The latest finished run (by slot) of each schedule in $1, for the console's schedule list.
-- One LATERAL probe per schedule walks runs_schedule_idx (schedule_id, slot DESC) and stops
-- at the first finished row.
SELECT s.id AS schedule_id, r.id, r.status, r.skip_reason, r.missed_slots, r.slot,
       r.finished_at, r.error
FROM unnest($1::bigint[]) AS s(id)
CROSS JOIN LATERAL (
    SELECT id, status, skip_reason, missed_slots, slot, finished_at, error
    FROM runs
    WHERE schedule_id = s.id AND status IN ('succeeded', 'dead', 'cancelled', 'skipped')
    ORDER BY slot DESC, id DESC
    LIMIT 1
) r;

-- name: run_dead_page
-- One page of dead runs, newest first, with their schedule's name and zone and the run that
-- replays each (if any), scoped to an owner ($1 NULL: every owner's).
SELECT r.id, r.schedule_id, s.name AS schedule_name, s.timezone, r.slot, r.origin,
       r.attempts, r.max_attempts, r.error, r.finished_at, rp.id AS replayed_by
FROM runs r
JOIN schedules s ON s.id = r.schedule_id
LEFT JOIN runs rp ON rp.replay_of = r.id AND rp.origin = 'replay'
WHERE r.status = 'dead'
  AND ($1::text IS NULL OR s.owner = $1)
  AND ($2::bigint IS NULL OR r.id < $2)
ORDER BY r.id DESC
LIMIT $3;
