-- name: followup_get
-- A follow-up by its owner and key, with what its schedule holds.
SELECT f.*, s.vars, s.prompt, s.provider, s.enabled, s.notify
FROM followups f
JOIN schedules s ON s.id = f.schedule_id
WHERE f.owner = $1 AND f.key = $2;

-- name: followup_lock
SELECT * FROM followups WHERE owner = $1 AND key = $2 FOR UPDATE;

-- name: followup_insert
INSERT INTO followups (schedule_id, owner, key, request, due_at, max_checks, horizon, escalate,
                       resolution)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: followup_checks
SELECT * FROM followup_checks WHERE schedule_id = $1 ORDER BY id;

-- name: followup_list
-- One page of an owner's follow-ups (every owner's for $1 NULL), newest first, by state.
SELECT f.*, s.vars, s.prompt, s.provider, s.enabled, s.notify
FROM followups f
JOIN schedules s ON s.id = f.schedule_id
WHERE ($1::text IS NULL OR f.owner = $1) AND ($2::text IS NULL OR f.state = $2)
  AND ($3::bigint IS NULL OR f.schedule_id < $3)
ORDER BY f.schedule_id DESC
LIMIT $4;

-- name: followup_cancel
-- Cancel a follow-up (locked by the caller): it starts no further check (its schedule is
-- paused, its pending checks are cancelled), a running check is asked to stop (the cancel path
-- of runs), and the ledger says who cancelled it and when.
WITH marked AS (
    UPDATE followups
    SET state = 'cancelled', cancelled_by = $2, cancelled_at = coalesce($3::timestamptz, now()),
        updated_at = coalesce($3::timestamptz, now())
    WHERE schedule_id = $1
), paused AS (
    UPDATE schedules
    SET enabled = false, pause_reason = 'follow-up cancelled', next_fire_at = NULL,
        version = version + 1, updated_at = coalesce($3::timestamptz, now())
    WHERE id = $1
), stopped AS (
    UPDATE runs r
    SET status = CASE WHEN r.status = 'pending' THEN 'cancelled' ELSE r.status END,
        finished_at = CASE WHEN r.status = 'pending' THEN coalesce($3::timestamptz, now())
                           ELSE r.finished_at END,
        error = CASE WHEN r.status = 'pending' THEN 'the follow-up was cancelled'
                     ELSE r.error END,
        cancel_requested = r.status = 'running'
    WHERE r.schedule_id = $1 AND r.status IN ('pending', 'running')
    RETURNING r.id
), changed AS (
    INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes, at)
    SELECT id, owner, $2, 'pause', '{"reason": "follow-up cancelled"}'::jsonb,
           coalesce($3::timestamptz, now())
    FROM schedules WHERE id = $1
)
SELECT count(*)::int AS stopped FROM stopped;

-- name: followup_lock_runs
-- The follow-up's unfinished runs, locked before its followups row: the order in which the
-- finish of a check takes them (runs, then followup_record), so a cancel and a finish never
-- wait on each other in a circle.
SELECT r.id FROM runs r
JOIN followups f ON f.schedule_id = r.schedule_id
WHERE f.owner = $1 AND f.key = $2 AND r.status IN ('pending', 'running')
ORDER BY r.id
FOR UPDATE OF r;
