-- name: attempt_append_step
-- Append one step to the attempt's transcript (an insert-only row of attempt_steps) and
-- publish its progress event, in one round trip. Guarded like every attempt write: once the
-- attempt is no longer the run's running one (finished, or lost to the reaper) nothing is
-- appended and nothing is published. FOR SHARE makes a finish or a reap that is under way
-- finish first, and the guard is then read again on the row it left. NOTIFY from an
-- autocommit statement is delivered at once. The guard is one condition on the row, so
-- the run is read by its primary key whatever the statistics say (run_finish_many).
WITH live AS (
    SELECT id FROM runs
    WHERE id = $5
      AND CASE WHEN status = 'running' THEN attempt_id END IS NOT DISTINCT FROM $2::uuid
      AND $2::uuid IS NOT NULL
    FOR SHARE
), appended AS (
    INSERT INTO attempt_steps (run_id, attempt_id, entry)
    SELECT id, $2, $3::jsonb || jsonb_build_object('at', coalesce($1::timestamptz, now()))
    FROM live
    RETURNING run_id
)
SELECT pg_notify('promptsched_progress', $4::text) FROM appended;

-- name: run_get_status
SELECT r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id
WHERE r.id = $1 AND ($2::text IS NULL OR s.owner = $2);
