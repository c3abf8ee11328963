-- name: schedule_insert
INSERT INTO schedules (
    owner, name, kind, expression, timezone, dst_gap, dst_fold, prompt, provider, model, params,
    misfire_policy, misfire_cap, misfire_grace, catchup_window, overlap_policy, max_attempts,
    timeout, jitter, enabled, next_fire_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
        $20, $21)
RETURNING *;

-- name: schedule_get
SELECT * FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2);

-- name: schedule_list
SELECT * FROM schedules
WHERE ($1::text IS NULL OR owner = $1) AND id > $2
ORDER BY id
LIMIT $3;

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
SELECT extract(epoch FROM (min(next_fire_at) - coalesce($1::timestamptz, now())))::float8
FROM schedules
WHERE enabled;

-- name: schedule_set_enabled
UPDATE schedules
SET enabled = $2, updated_at = now(), version = version + 1,
    next_fire_at = CASE WHEN $2 THEN coalesce($3, next_fire_at) ELSE next_fire_at END
WHERE id = $1
RETURNING *;

-- name: schedule_delete
DELETE FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2) RETURNING id;

-- name: schedule_notify_changed
SELECT pg_notify('promptsched_schedules', $1::text);
