-- name: schedule_search
-- One page of schedules in id order, optionally by state and a case-insensitive name
-- substring (strpos, so the user's text is never read as a LIKE pattern).
SELECT * FROM schedules
WHERE ($1::text IS NULL OR owner = $1)
  AND ($2::boolean IS NULL OR enabled = $2)
  AND ($3::text IS NULL OR strpos(lower(name), lower($3)) > 0)
  AND id > $4
ORDER BY id
LIMIT $5;

-- name: schedule_change_page
-- One page of a schedule's history, newest first; rows outlive a deleted schedule.
SELECT id, schedule_id, owner, actor, action, changes, at
FROM schedule_changes
WHERE schedule_id = $1
  AND ($2::text IS NULL OR owner = $2)
  AND ($3::bigint IS NULL OR id < $3)
ORDER BY id DESC
LIMIT $4;

-- name: schedule_change_around
-- What explains an instant $2: the last change of enabled state at or before it (create,
-- pause, resume and their automatic kinds: the state then), and the edits after it, newest
-- first (undoing them gives the expression that was in force at $2).
(SELECT id, schedule_id, owner, actor, action, changes, at, false AS later
 FROM schedule_changes
 WHERE schedule_id = $1 AND at <= $2
   AND action IN ('create', 'pause', 'resume', 'auto_pause', 'auto_resume')
 ORDER BY id DESC
 LIMIT 1)
UNION ALL
(SELECT id, schedule_id, owner, actor, action, changes, at, true AS later
 FROM schedule_changes
 WHERE schedule_id = $1 AND at > $2 AND action = 'update'
 ORDER BY id DESC
 LIMIT 1000);

-- name: run_list_for_slot
-- The runs of one slot (any origin), plus the nearest cadence runs before and after it: a
-- misfire policy may have coalesced the slot into the later one (missed_slots counts them).
-- Each branch walks runs_schedule_idx.
(SELECT r.*, 'at' AS position FROM runs r
 WHERE r.schedule_id = $1 AND r.slot = $2
 ORDER BY r.id
 LIMIT 100)
UNION ALL
(SELECT r.*, 'after' AS position FROM runs r
 WHERE r.schedule_id = $1 AND r.origin = 'cadence' AND r.slot > $2
 ORDER BY r.slot
 LIMIT 1)
UNION ALL
(SELECT r.*, 'before' AS position FROM runs r
 WHERE r.schedule_id = $1 AND r.origin = 'cadence' AND r.slot < $2
 ORDER BY r.slot DESC
 LIMIT 1);

-- name: run_cancel
-- Cancel, guarded by the status: a pending run ends cancelled at once; a running one is
-- asked to stop, and its worker's next heartbeat turns that into a cooperative stop that
-- ends the run cancelled. (In SET, r.status is the value before this update.)
UPDATE runs r
SET status = CASE WHEN r.status = 'pending' THEN 'cancelled' ELSE r.status END,
    finished_at = CASE WHEN r.status = 'pending' THEN coalesce($3::timestamptz, now())
                       ELSE r.finished_at END,
    error = CASE WHEN r.status = 'pending' THEN $4 ELSE r.error END,
    cancel_requested = r.status = 'running'
FROM schedules s
WHERE r.id = $1 AND s.id = r.schedule_id AND ($2::text IS NULL OR s.owner = $2)
  AND r.status IN ('pending', 'running')
RETURNING r.*;

-- name: run_insert_replay
-- Replay a dead run: a new run for the same slot, marked replay and linked to the old one.
-- runs_replay_key makes a second replay of the same run a no-op (no row returned).
INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at, replay_of,
                  serial, owner)
SELECT r.schedule_id, r.slot, 'replay', s.provider, s.max_attempts,
       coalesce($3::timestamptz, now()), r.id, false, s.owner
FROM runs r
JOIN schedules s ON s.id = r.schedule_id
WHERE r.id = $1 AND r.status = 'dead' AND ($2::text IS NULL OR s.owner = $2)
ON CONFLICT (replay_of) WHERE origin = 'replay' DO NOTHING
RETURNING *;

-- name: run_get_replay
SELECT id, status FROM runs WHERE replay_of = $1 AND origin = 'replay';

-- name: schedule_spend
-- A schedule's tokens and cost in the current UTC day and month (runs by slot, through
-- runs_schedule_idx), for GET /v1/schedules/{id}.
SELECT coalesce(sum(tokens) FILTER (WHERE slot >= date_trunc('day', t.now) AT TIME ZONE 'UTC'), 0)::bigint
           AS day_tokens,
       coalesce(sum(cost) FILTER (WHERE slot >= date_trunc('day', t.now) AT TIME ZONE 'UTC'), 0)::float8
           AS day_cost,
       coalesce(sum(tokens), 0)::bigint AS month_tokens,
       coalesce(sum(cost), 0)::float8 AS month_cost
FROM (SELECT coalesce($2::timestamptz, now()) AT TIME ZONE 'UTC' AS now) t
LEFT JOIN runs r ON r.schedule_id = $1
                AND r.slot >= date_trunc('month', t.now) AT TIME ZONE 'UTC'
                AND r.slot < (date_trunc('month', t.now) + interval '1 month') AT TIME ZONE 'UTC';

-- name: owner_spend
-- An owner's tokens and cost over all its schedules in the current UTC day and month (runs by
-- slot), as budget_verdict counts them.
SELECT coalesce(sum(r.tokens) FILTER (WHERE r.slot >= date_trunc('day', t.now) AT TIME ZONE 'UTC'), 0)::bigint
           AS day_tokens,
       coalesce(sum(r.cost) FILTER (WHERE r.slot >= date_trunc('day', t.now) AT TIME ZONE 'UTC'), 0)::float8
           AS day_cost,
       coalesce(sum(r.tokens), 0)::bigint AS month_tokens,
       coalesce(sum(r.cost), 0)::float8 AS month_cost
FROM (SELECT coalesce($2::timestamptz, now()) AT TIME ZONE 'UTC' AS now) t
LEFT JOIN schedules s ON s.owner = $1
LEFT JOIN runs r ON r.schedule_id = s.id
                AND r.slot >= date_trunc('month', t.now) AT TIME ZONE 'UTC'
                AND r.slot < (date_trunc('month', t.now) + interval '1 month') AT TIME ZONE 'UTC';

-- name: owner_budget_get
SELECT budget, updated_at FROM owner_budgets WHERE owner = $1;

-- name: owner_budget_set
-- Sets (or, with NULL, removes) an owner's budget; returns the budget now in force.
WITH removed AS (
    DELETE FROM owner_budgets WHERE owner = $1 AND $2::jsonb IS NULL
), stored AS (
    INSERT INTO owner_budgets (owner, budget, updated_at)
    SELECT $1, $2::jsonb, now() WHERE $2::jsonb IS NOT NULL
    ON CONFLICT (owner) DO UPDATE SET budget = excluded.budget, updated_at = excluded.updated_at
    RETURNING budget
)
SELECT (SELECT budget FROM stored) AS budget;
