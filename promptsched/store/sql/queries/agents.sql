-- name: attempt_append_step
-- Append one step to the attempt's transcript and publish its progress event, in one round
-- trip. Guarded like every attempt write: once the attempt is no longer running (finished,
-- or marked lost by the reaper) nothing is appended and nothing is published. NOTIFY from
-- an autocommit statement is delivered at once.
WITH appended AS (
    UPDATE run_attempts
    SET transcript = transcript
        || jsonb_build_array($3::jsonb || jsonb_build_object('at', coalesce($1::timestamptz, now())))
    WHERE attempt_id = $2 AND status = 'running'
    RETURNING run_id
)
SELECT pg_notify('promptsched_progress', $4::text) FROM appended;

-- name: run_get_status
SELECT r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id
WHERE r.id = $1 AND ($2::text IS NULL OR s.owner = $2);
