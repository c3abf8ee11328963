-- name: schedule_insert
INSERT INTO schedules (
    owner, name, kind, expression, timezone, dst_gap, dst_fold, prompt, provider, model, params,
    misfire_policy, misfire_cap, misfire_grace, catchup_window, overlap_policy, max_attempts,
    timeout, jitter, output_schema, notify_when, give_up_after, fallback, enabled, next_fire_at,
    pause_after_failures, notify, budget, vars, followup_key)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,
        $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30)
RETURNING *;

-- name: schedule_count_owned
-- How many schedules owner $1 has, follow-ups apart (PROMPTSCHED_OWNER_MAX_SCHEDULES), after
-- taking the owner's transaction lock: two creates of one owner at once count one after the
-- other, so they never both take the last place (call it before the count's own statement,
-- whose snapshot then sees the other's commit).
SELECT count(*)::int FROM schedules WHERE owner = $1 AND followup_key IS NULL;

-- name: schedule_lock_owner
SELECT pg_advisory_xact_lock(hashtextextended('promptsched.owner_schedules:' || $1, 0));

-- name: schedule_get
SELECT * FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2);

-- name: schedule_plan_fresh
-- Run first in a batch's transaction: the take below is planned for this execution, never
-- from a plan cached while the tables were small. A generic plan built while `runs` held a
-- few hundred rows probes unfinished runs with a sequential scan that compares each row with
-- the batch's whole id array; when a rush then writes 100,000 rows, each take costs seconds
-- instead of milliseconds (docs/performance.md, "Plans that outgrow their tables").
-- Transaction-local, so it holds behind a transaction pooler and leaves no session state;
-- schedule_plan_cached sets it back for the tick, whose cached plan is the better one (a
-- custom plan sees the batch's 5,000 ids and joins them to schedules with a full scan).
-- Sorting is off for the take too: due schedules are read in cursor order from
-- schedules_due_idx, never sorted after a full scan. Under stale statistics (a table never
-- analyzed, whose row count Postgres guesses from its pages and the columns' default widths)
-- the sort looked cheaper for a few thousand schedules, and any new column tipped it.
-- JIT compilation is off for the whole batch: a disabled sort still in the plan (the take's
-- final ORDER BY) costs 10^10 to the planner, past every jit_*_above_cost, and Postgres
-- built with LLVM then compiled each take, 0.5-1.8 s of CPU for a take that runs in a
-- millisecond (seen in W9 on Debian's Postgres 15). A batch's statements are short; none
-- gains from JIT.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('enable_sort', 'off', true),
       set_config('jit', 'off', true);

-- name: schedule_plan_cached
SELECT set_config('plan_cache_mode', 'auto', true), set_config('enable_sort', 'on', true);

-- name: schedule_take_due
-- Lock up to $2 due schedules in cursor order; SKIP LOCKED lets several schedulers share the
-- work without waiting on each other (walks schedules_due_idx). NO KEY UPDATE is the lock the
-- cursor advance needs: it excludes other schedulers and editors, yet lets a concurrent insert
-- of a run (manual trigger, backfill) check its foreign key without waiting.
-- One row per group of schedules that share a fire-time computation, an overlap decision and
-- the columns their runs copy (provider, max_attempts), with the ids of its schedules: the
-- scheduler plans per group, not per schedule.
-- `unfinished` counts a schedule's pending or running runs, capped at 2 (the overlap policies
-- only tell 0, 1 and 2+ apart, promptsched.schedule.overlap); `allow` and `buffer_all` never
-- look. The ids reach runs_unfinished_idx as one array: a probe per schedule whatever the
-- statistics say (a LATERAL probe can turn into a scan per schedule under stale ones, and a
-- join into a read of every unfinished run). The counts come back as one map from schedule
-- id to count, read by key for each due schedule: joined to the batch instead, statistics
-- that expected one due schedule made the join probe every schedule's runs again for each
-- due schedule (a batch of 50 read 1,324 index entries for 50 runs; a rush of 5,000 would
-- read millions).
-- Contention, as in run_claim_batch: `claimable` is how many due schedules this batch could
-- have taken had no other scheduler held any (the due predicate read from the statement's
-- snapshot without SKIP LOCKED), less $3, the due schedules this process's own other batches
-- hold right now, capped at $2. The row always comes back, with NULL group columns when
-- nothing was taken.
WITH due AS (
    SELECT id, kind, expression, timezone, dst_gap, dst_fold, next_fire_at, misfire_policy,
           misfire_cap, misfire_grace, catchup_window, overlap_policy, jitter, provider,
           max_attempts, owner
    FROM schedules
    WHERE enabled AND next_fire_at <= coalesce($1::timestamptz, now())
    ORDER BY next_fire_at
    LIMIT $2
    FOR NO KEY UPDATE SKIP LOCKED
), busy AS MATERIALIZED (
    SELECT jsonb_object_agg(b.schedule_id::text, b.unfinished) AS unfinished
    FROM (SELECT r.schedule_id, least(count(*), 2)::int AS unfinished
          FROM runs r
          WHERE r.status IN ('pending', 'running')
            AND r.schedule_id = ANY (ARRAY(SELECT id FROM due
                                           WHERE overlap_policy NOT IN ('allow', 'buffer_all')))
          GROUP BY r.schedule_id) AS b
), seen AS (
    -- A full batch skips the second read (CASE reaches its ELSE InitPlan only when needed).
    SELECT CASE WHEN (SELECT count(*) FROM due) >= $2 THEN $2::int
                ELSE least($2, greatest(0, (SELECT count(*)::int FROM (
                         SELECT 1 FROM schedules
                         WHERE enabled AND next_fire_at <= coalesce($1::timestamptz, now())
                         ORDER BY next_fire_at
                         LIMIT $2 + $3) e) - $3))
           END AS claimable
), groups AS (
    SELECT d.kind, d.expression, d.timezone, d.dst_gap, d.dst_fold, d.next_fire_at,
           d.misfire_policy, d.misfire_cap, d.misfire_grace, d.catchup_window,
           d.overlap_policy, d.jitter, d.provider, d.max_attempts,
           coalesce((b.unfinished ->> d.id::text)::int, 0) AS unfinished,
           -- the owner of each schedule, in the order of ids (one aggregation reads both)
           array_agg(d.id) AS ids, array_agg(d.owner) AS owners,
           coalesce($1::timestamptz, now()) AS db_now
    FROM due d
    CROSS JOIN busy b
    GROUP BY d.next_fire_at, d.kind, d.expression, d.timezone, d.dst_gap, d.dst_fold,
             d.misfire_policy, d.misfire_cap, d.misfire_grace, d.catchup_window,
             d.overlap_policy, d.jitter, d.provider, d.max_attempts,
             coalesce((b.unfinished ->> d.id::text)::int, 0)
)
SELECT g.*, seen.claimable
FROM seen
LEFT JOIN groups g ON true
ORDER BY g.next_fire_at;

-- name: schedule_tick
-- One statement writes a batch that schedule_take_due locked in this transaction. Each
-- schedule ($2) follows a variant ($3, a 1-based index into $4..$8) of the batch's plans:
-- its new cursor ($4, NULL: never fires again), whether its unfinished runs are cancelled
-- ($5, overlap cancel_other), and what its runs copy from it ($6 provider, $7 max_attempts,
-- $8 overlap policy), read under the same locks. The variant's run rows are $9..$14
-- (variant, slot, status, skip_reason, missed slots, available_at). Cursor advance and run
-- rows land together. The partial unique index on (schedule_id, slot) for cadence runs makes
-- a second scheduler's row for the same slot a no-op (invariant 1). NOTIFY is delivered at
-- commit. Returns counts, the tick lag of every pending row, and the rows to log: the skipped
-- ones, and every one when $15.
-- $17: runs an owner's schedules may make due in one minute (PROMPTSCHED_OWNER_RUNS_PER_MINUTE,
-- 0: no quota). The pending rows of an owner past its minute's room are deferred, never
-- dropped: they are written pending, available at the start of the first later minute with
-- room (docs/reliability.md, "Fair to every owner"); `deferred` counts them. The minutes'
-- counts are kept in owner_minutes (0037_owner_lanes.sql), one row per concurrent writer
-- (shard: the backend), so two batches of one owner never wait for each other's commit.
WITH t AS (
    -- $16: each schedule's owner, for its runs (the claim's lanes, 0037_owner_lanes.sql)
    SELECT * FROM unnest($2::bigint[], $3::integer[], $16::text[]) AS t(id, variant, owner)
), v AS (
    SELECT * FROM unnest($4::timestamptz[], $5::boolean[], $6::text[], $7::integer[],
                         $8::text[]) WITH ORDINALITY
        AS v(next_fire_at, cancel, provider, max_attempts, overlap_policy, variant)
), r AS (
    SELECT * FROM unnest($9::integer[], $10::timestamptz[], $11::text[], $12::text[],
                         $13::integer[], $14::timestamptz[])
        AS r(variant, slot, status, skip_reason, missed, available_at)
), advanced AS (
    UPDATE schedules s
    SET next_fire_at = v.next_fire_at
    FROM t JOIN v USING (variant)
    WHERE s.id = t.id
), doomed AS (
    SELECT t.id FROM t JOIN v USING (variant) WHERE v.cancel
), cancelled AS (
    -- overlap=cancel_other: pending runs end cancelled now; running ones are asked to stop
    -- and learn it through their next heartbeat. The statement's snapshot keeps the rows it
    -- inserts out of reach. A batch with nothing to cancel never reads runs here.
    UPDATE runs
    SET status = 'cancelled', finished_at = coalesce($1::timestamptz, now()),
        error = 'cancelled by a newer slot (overlap cancel_other)'
    WHERE true = ANY ($5::boolean[])
      AND schedule_id = ANY (ARRAY(SELECT id FROM doomed)) AND status = 'pending'
    RETURNING 1
), signalled AS (
    UPDATE runs
    SET cancel_requested = true
    WHERE true = ANY ($5::boolean[])
      AND schedule_id = ANY (ARRAY(SELECT id FROM doomed)) AND status = 'running'
      AND NOT cancel_requested
    RETURNING 1
), rows AS MATERIALIZED (
    SELECT t.id, r.slot, r.status, r.skip_reason, r.missed, v.provider, v.max_attempts,
           r.available_at, v.overlap_policy, t.owner
    FROM t
    JOIN v USING (variant)
    JOIN r USING (variant)
), tally AS (
    -- Per owner (only with a quota): its pending rows of this batch, and its minute's count.
    SELECT w.owner, count(*) AS n,
           coalesce((SELECT sum(m.runs) FROM owner_minutes m
                     WHERE m.owner = w.owner
                       AND m.minute = date_trunc('minute', coalesce($1::timestamptz, now()))),
                    0) AS used
    FROM rows w
    WHERE $17::integer > 0 AND w.status = 'pending'
    GROUP BY w.owner
), placed AS (
    -- The pending rows of the owners this batch takes past their quota (none, mostly), in
    -- slot order, each with the minute it counts in (0: this one, 1: the next, ...).
    SELECT w.id, w.slot,
           ((o.used + row_number() OVER (PARTITION BY w.owner ORDER BY w.slot, w.id) - 1)
            / $17::integer)::integer AS later
    FROM rows w
    JOIN tally o ON o.owner = w.owner AND o.used + o.n > $17::integer
    WHERE w.status = 'pending'
), deferrals AS (
    -- The deferred rows as one map from run (schedule@slot) to its minute, read by key for
    -- each row: joined to the batch instead, a misestimate could compare every row with
    -- every deferred one.
    SELECT coalesce(jsonb_object_agg(p.id::text || '@' || extract(epoch FROM p.slot)::text,
                                     p.later) FILTER (WHERE p.later > 0), '{}') AS later,
           count(*) FILTER (WHERE p.later > 0)::int AS deferred
    FROM placed p
), counted AS (
    INSERT INTO owner_minutes (owner, minute, shard, runs)
    SELECT w.owner,
           date_trunc('minute', coalesce($1::timestamptz, now()))
               + CASE WHEN d.deferred = 0 THEN 0
                      ELSE coalesce((d.later ->> (w.id::text || '@'
                                                  || extract(epoch FROM w.slot)::text))
                                    ::integer, 0) END * interval '1 minute',
           pg_backend_pid() % 16, count(*)
    FROM rows w
    CROSS JOIN deferrals d
    WHERE $17::integer > 0 AND w.status = 'pending'
    GROUP BY 1, 2, 3
    ON CONFLICT (owner, minute, shard) DO UPDATE SET runs = owner_minutes.runs + excluded.runs
), pruned AS (
    DELETE FROM owner_minutes
    WHERE owner = ANY (ARRAY(SELECT owner FROM tally))
      AND minute < date_trunc('minute', coalesce($1::timestamptz, now())) - interval '1 hour'
), inserted AS (
    INSERT INTO runs (schedule_id, slot, origin, status, skip_reason, missed_slots, provider,
                      max_attempts, available_at, serial, finished_at, created_at, owner)
    SELECT w.id, w.slot, 'cadence', w.status, w.skip_reason, w.missed, w.provider,
           w.max_attempts,
           CASE WHEN d.deferred = 0 THEN w.available_at
                ELSE greatest(w.available_at,
                              date_trunc('minute', coalesce($1::timestamptz, now()))
                              + coalesce((d.later ->> (w.id::text || '@'
                                                       || extract(epoch FROM w.slot)::text))
                                         ::integer, 0) * interval '1 minute') END,
           w.overlap_policy IN ('buffer_one', 'buffer_all'),
           CASE WHEN w.status = 'skipped' THEN coalesce($1::timestamptz, now()) END,
           -- the real instant, not the transaction's start: tick lag is measured from it
           coalesce($1::timestamptz, clock_timestamp()), w.owner
    FROM rows w
    CROSS JOIN deferrals d
    ON CONFLICT (schedule_id, slot) WHERE origin = 'cadence' DO NOTHING
    RETURNING id, schedule_id, slot, status, skip_reason, missed_slots, created_at
), woke AS (
    SELECT pg_notify('promptsched_runs', 'tick')
    FROM (SELECT 1 FROM inserted WHERE status = 'pending' LIMIT 1) i
)
SELECT count(*) FILTER (WHERE status = 'pending')::int AS enqueued,
       count(*) FILTER (WHERE status = 'skipped')::int AS skipped,
       count(*) FILTER (WHERE skip_reason = 'overlap')::int AS overlap,
       coalesce(array_agg(extract(epoch FROM created_at - slot)::float8)
                FILTER (WHERE status = 'pending'), '{}') AS lags,
       coalesce(array_agg((id, schedule_id, slot, status, skip_reason, missed_slots))
                FILTER (WHERE $15::boolean OR status <> 'pending'), '{}') AS logged,
       (SELECT count(*) FROM cancelled)::int AS cancelled,
       (SELECT count(*) FROM signalled)::int AS signalled,
       (SELECT count(*) FROM woke)::int AS woken,
       (SELECT deferred FROM deferrals) AS deferred
FROM inserted
-- The tick's commit does not wait for its WAL flush (docs/reliability.md, "Which commits
-- wait"): a tick lost to a database crash leaves its cursors where they were, so the next
-- tick writes the same slots again, and no run of it can have finished durably before it.
CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS quick;

-- name: schedule_seconds_until_due
-- The next instant the scheduler has work: a due cursor or a paused schedule to resume.
SELECT extract(epoch FROM (least(
           (SELECT min(next_fire_at) FROM schedules
            WHERE enabled AND next_fire_at IS NOT NULL),
           (SELECT min(paused_until) FROM schedules WHERE NOT enabled))
       - coalesce($1::timestamptz, now())))::float8;

-- name: schedule_take_pause_ended
-- "pause until": lock the schedules whose pause ran out (SKIP LOCKED, so several schedulers
-- share them), with what planning the end of each pause needs (schedule_end_pauses).
SELECT id, kind, expression, timezone, dst_gap, dst_fold, next_fire_at, paused_until,
       misfire_cap
FROM schedules
WHERE NOT enabled AND paused_until <= coalesce($1::timestamptz, now())
ORDER BY paused_until
LIMIT $2
FOR NO KEY UPDATE SKIP LOCKED;

-- name: schedule_end_pauses
-- End the pauses schedule_take_pause_ended locked in this transaction, in one statement:
-- each schedule ($2) is enabled again with its cursor at the first slot at or after the end
-- of its pause ($3), the slots inside the pause get their skipped rows (reason `paused`: $4
-- schedule, $5 slot, $6 the more slots a row stands for), and its history says promptsched
-- resumed it and how many slots the pause skipped. The slots inside the pause never run: the
-- user said so by giving the pause an end (docs/scheduling.md, "Pause and resume").
WITH ended AS (
    UPDATE schedules s
    SET enabled = true, paused_until = NULL, pause_reason = NULL, version = s.version + 1,
        next_fire_at = e.next_fire_at, updated_at = coalesce($1::timestamptz, now())
    FROM unnest($2::bigint[], $3::timestamptz[]) AS e(id, next_fire_at)
    WHERE s.id = e.id AND NOT s.enabled AND s.paused_until <= coalesce($1::timestamptz, now())
    RETURNING s.id, s.owner, s.provider, s.max_attempts
), skipped AS (
    INSERT INTO runs (schedule_id, slot, origin, status, skip_reason, missed_slots, provider,
                      max_attempts, available_at, serial, finished_at, created_at)
    SELECT e.id, r.slot, 'cadence', 'skipped', 'paused', r.missed, e.provider, e.max_attempts,
           r.slot, false, coalesce($1::timestamptz, now()), coalesce($1::timestamptz, now())
    FROM unnest($4::bigint[], $5::timestamptz[], $6::integer[]) AS r(schedule_id, slot, missed)
    JOIN ended e ON e.id = r.schedule_id
    ON CONFLICT (schedule_id, slot) WHERE origin = 'cadence' DO NOTHING
    RETURNING schedule_id, missed_slots
), counted AS (
    SELECT e.id, e.owner,
           coalesce((SELECT sum(1 + k.missed_slots) FROM skipped k WHERE k.schedule_id = e.id),
                    0)::int AS skipped
    FROM ended e
), logged AS (
    INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes, at)
    SELECT id, owner, 'promptsched', 'auto_resume', jsonb_build_object('skipped', skipped),
           coalesce($1::timestamptz, now())
    FROM counted
)
SELECT id, skipped FROM counted ORDER BY id;

-- name: schedule_get_for_update
SELECT * FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2) FOR UPDATE;

-- name: schedule_update
-- Optimistic concurrency: the write lands only on the version the editor read.
UPDATE schedules
SET name = $3, kind = $4, expression = $5, timezone = $6, dst_gap = $7, dst_fold = $8,
    prompt = $9, provider = $10, model = $11, params = $12, misfire_policy = $13,
    misfire_cap = $14, misfire_grace = $15, catchup_window = $16, overlap_policy = $17,
    max_attempts = $18, timeout = $19, jitter = $20, output_schema = $21, notify_when = $22,
    give_up_after = $23, fallback = $24,
    next_fire_at = $25, pause_after_failures = $26, notify = $27, budget = $28,
    version = version + 1,
    updated_at = now()
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
-- Pause a schedule whose last pause_after_failures finished runs all went dead, with its
-- history row and the "paused" message owed to the owner on the failure channels (keyed by
-- the run $2 that tipped it over), in one statement: all three land or none does. NOTIFY is
-- delivered at commit.
WITH paused AS (
    UPDATE schedules s
    SET enabled = false, paused_until = NULL, version = version + 1,
        updated_at = coalesce($3::timestamptz, now()),
        pause_reason = format('paused after %s consecutive dead runs', s.pause_after_failures)
    WHERE s.id = $1 AND s.enabled AND s.pause_after_failures IS NOT NULL
      AND s.pause_after_failures = (
          SELECT count(*) FILTER (WHERE recent.status = 'dead') FROM (
              SELECT status FROM runs
              WHERE schedule_id = s.id AND status IN ('succeeded', 'dead')
              ORDER BY finished_at DESC
              LIMIT s.pause_after_failures) recent)
    RETURNING id, owner, pause_reason
), logged AS (
    INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes, at)
    SELECT id, owner, 'promptsched', 'auto_pause', jsonb_build_object('reason', pause_reason),
           coalesce($3::timestamptz, now())
    FROM paused
    RETURNING 1
), owed AS (
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key,
                        available_at, created_at)
    SELECT $2, c.schedule_id, c.channel, c.target, 'paused',
           format('promptsched-%s-paused-%s', $2::bigint, c.channel),
           coalesce($3::timestamptz, now()), coalesce($3::timestamptz, now())
    FROM paused p
    JOIN notify_channels c ON c.schedule_id = p.id AND c.on_failure
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
), woke AS (
    SELECT pg_notify('promptsched_outbox', 'paused') FROM (SELECT 1 FROM owed LIMIT 1) o
)
SELECT p.id, p.owner, p.pause_reason, (SELECT count(*) FROM logged)::int AS logged,
       (SELECT count(*) FROM owed)::int AS owed, (SELECT count(*) FROM woke)::int AS woken
FROM paused p;

-- name: schedule_change_insert
INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes)
VALUES ($1, $2, $3, $4, $5);

-- name: schedule_delete
DELETE FROM schedules WHERE id = $1 AND ($2::text IS NULL OR owner = $2) RETURNING id;

-- name: schedule_notify_changed
SELECT pg_notify('promptsched_schedules', $1::text);

-- name: schedule_pause_unplannable
-- Pause schedules whose fire times cannot be computed (say, a zone or an expression this
-- version no longer reads), so that they stop holding back every schedule in their batch; the
-- reason says why, and the change log records that promptsched paused them.
WITH paused AS (
    UPDATE schedules
    SET enabled = false, paused_until = NULL, pause_reason = $2, version = version + 1,
        updated_at = now()
    WHERE id = ANY ($1::bigint[])
    RETURNING id, owner
), logged AS (
    INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes)
    SELECT id, owner, 'promptsched', 'auto_pause', jsonb_build_object('reason', $2::text)
    FROM paused
)
SELECT count(*)::int FROM paused;

-- name: schedule_name_claim
-- Register the schedule's name under its owner, releasing the name it had: the schedule that
-- holds the name afterwards ($3 when it was free or already its own, another when it is
-- taken; the name is unique per owner, migration 0032). A concurrent claim of the same name
-- waits for this one's transaction and then finds it taken.
WITH released AS (
    DELETE FROM schedule_names WHERE schedule_id = $3 AND name IS DISTINCT FROM $2
)
INSERT INTO schedule_names (owner, name, schedule_id)
VALUES ($1, $2, $3)
ON CONFLICT (owner, name) DO UPDATE SET schedule_id = schedule_names.schedule_id
RETURNING schedule_id;
