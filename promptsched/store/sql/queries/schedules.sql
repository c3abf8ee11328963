-- name: schedule_insert
INSERT INTO schedules (
    owner, name, kind, expression, timezone, dst_gap, dst_fold, prompt, provider, model, params,
    misfire_policy, misfire_cap, misfire_grace, catchup_window, overlap_policy, max_attempts,
    timeout, jitter, enabled, next_fire_at, pause_after_failures, notify)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
        $20, $21, $22, $23)
RETURNING *;

-- name: schedule_get
SELECT * FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2);

-- name: schedule_take_due
-- Lock due schedules in cursor order; SKIP LOCKED lets several schedulers share the work
-- without waiting on each other. Walks schedules_due_idx.
SELECT id, kind, expression, timezone, dst_gap, dst_fold, next_fire_at, misfire_policy,
       misfire_cap, misfire_grace, catchup_window, overlap_policy, jitter,
       coalesce($1::timestamptz, now()) AS db_now
FROM schedules
WHERE enabled AND next_fire_at <= coalesce($1::timestamptz, now())
ORDER BY next_fire_at
LIMIT $2
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance_many
-- Move each cursor; a NULL next_fire_at means the schedule will never fire again.
UPDATE schedules s
SET next_fire_at = a.next_fire_at
FROM unnest($1::bigint[], $2::timestamptz[]) AS a(id, next_fire_at)
WHERE s.id = a.id;

-- name: schedule_seconds_until_due
-- The next instant the scheduler has work: a due cursor or a paused schedule to resume.
SELECT extract(epoch FROM (least(
           (SELECT min(next_fire_at) FROM schedules WHERE enabled),
           (SELECT min(paused_until) FROM schedules WHERE NOT enabled))
       - coalesce($1::timestamptz, now())))::float8;

-- name: schedule_resume_due
-- "pause until": schedules whose pause ran out resume; their missed slots meet the misfire
-- policy on the next tick, since the cursor stayed where the pause left it.
UPDATE schedules
SET enabled = true, paused_until = NULL, pause_reason = NULL, version = version + 1,
    updated_at = coalesce($1::timestamptz, now())
WHERE NOT enabled AND paused_until <= coalesce($1::timestamptz, now())
RETURNING id, owner;

-- name: schedule_get_for_update
SELECT * FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2) FOR UPDATE;

-- name: schedule_update
-- Optimistic concurrency: the write lands only on the version the editor read.
UPDATE schedules
SET name = $3, kind = $4, expression = $5, timezone = $6, dst_gap = $7, dst_fold = $8,
    prompt = $9, provider = $10, model = $11, params = $12, misfire_policy = $13,
    misfire_cap = $14, misfire_grace = $15, catchup_window = $16, overlap_policy = $17,
    max_attempts = $18, timeout = $19, jitter = $20, next_fire_at = $21,
    pause_after_failures = $22, notify = $23, version = version + 1, updated_at = now()
WHERE id = $1 AND version = $2
RETURNING *;

-- name: schedule_pause
UPDATE schedules
SET enabled = false, paused_until = $3, pause_reason = $4, version = version + 1,
    updated_at = now()
WHERE id = $1 AND ($2::text IS NULL OR owner = $2)
RETURNING *;

-- name: schedule_resume
UPDATE schedules
SET enabled = true, paused_until = NULL, pause_reason = NULL, version = version + 1,
    updated_at = now()
WHERE id = $1 AND ($2::text IS NULL OR owner = $2)
RETURNING *;

-- name: schedule_pause_if_failing
-- Pause a schedule whose last pause_after_failures finished runs all went dead.
UPDATE schedules s
SET enabled = false, paused_until = NULL, version = version + 1, updated_at = now(),
    pause_reason = format('paused after %s consecutive dead runs', s.pause_after_failures)
WHERE s.id = $1 AND s.enabled AND s.pause_after_failures IS NOT NULL
  AND s.pause_after_failures = (
      SELECT count(*) FILTER (WHERE recent.status = 'dead') FROM (
          SELECT status FROM runs
          WHERE schedule_id = s.id AND status IN ('succeeded', 'dead')
          ORDER BY finished_at DESC
          LIMIT s.pause_after_failures) recent)
RETURNING id, owner, pause_reason;

-- name: schedule_change_insert
INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes)
VALUES ($1, $2, $3, $4, $5);

-- name: schedule_delete
DELETE FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2) RETURNING id;

-- name: schedule_notify_changed
SELECT pg_notify('promptsched_schedules', $1::text);
