-- name: run_claim_batch
-- Lock up to $3 claimable runs of provider $2 in claim-index order, skipping rows other
-- workers hold, then mint a fresh attempt_id (the fencing token) for each, all in one
-- statement. The attempt lives in the run row while it runs (attempt_id, worker_id, lease,
-- attempt_started_at): the claim writes nothing else (0013_two_writes_per_run.sql).
-- The ORDER BY matches runs_claim_idx so a large backlog is read in index order and never
-- sorted. Serial runs (overlap buffer_*) wait for every
-- earlier unfinished run of their schedule; a run locked by another claimer still counts as
-- unfinished here, so two claimers never start two serial runs of one schedule.
-- The update reaches the locked candidates through the primary key, as one array: joined to
-- them instead, a large claim from a mid-sized table read the whole runs table into a hash.
-- The candidates' LIMIT is the claim's size class, $3 rounded up to a power of two: the
-- wrapper (queries._claim_sql) writes it in, so each class keeps a generic plan instead of
-- being planned at every claim. The candidates are read lazily: the update's LIMIT $3 bounds
-- both what is claimed and what is locked.
-- Contention is measured in the same round trip: `claimable` is how many runs the claim
-- could have taken had no other claimer held any (the same predicate, read from the
-- statement's snapshot without SKIP LOCKED, capped at $3), so claimable - claimed rows were
-- skipped because another transaction held them. A run waiting for its own schedule's
-- predecessor is not claimable in either read. The row always comes back, with NULL run
-- columns when nothing was claimed.
-- Fair to every owner: while runs of a second owner wait for the provider, the claim takes
-- them round-robin by owner instead (run_claim_lanes, 0037_owner_lanes.sql), so one owner's
-- backlog never starves another's due runs; with one owner waiting it is the plain claim
-- above, after three index probes (docs/reliability.md, "Fair to every owner").
WITH owners AS (
    -- Whether an owner other than the one whose run is first in claim order has runs waiting
    -- for provider $2: a probe of runs_owner_claim_idx (0037_owner_lanes.sql) on each side of
    -- that owner's lane, never into it (a busy lane's front is the entries of runs claimed
    -- since the last vacuum, its end the rows a rush is writing: either can be thousands of
    -- entries to pass over). With one owner waiting, both land on the index's ends at once.
    SELECT coalesce((SELECT true FROM runs r
                     WHERE r.status = 'pending' AND r.provider = $2 AND r.owner < head.owner
                       AND r.available_at <= coalesce($1::timestamptz, now())
                     ORDER BY r.owner DESC LIMIT 1)
                    OR (SELECT true FROM runs r
                        WHERE r.status = 'pending' AND r.provider = $2 AND r.owner > head.owner
                          AND r.available_at <= coalesce($1::timestamptz, now())
                        ORDER BY r.owner LIMIT 1), false) AS several
    FROM (SELECT (SELECT r.owner FROM runs r
                  WHERE r.status = 'pending' AND r.provider = $2
                    AND r.available_at <= coalesce($1::timestamptz, now())
                  ORDER BY r.available_at, r.id LIMIT 1) AS owner) AS head
), candidates AS (
    -- One owner waiting (the common case): its runs in runs_claim_idx order, read lazily.
    SELECT one.id FROM (
        SELECT r.id
        FROM runs r
        WHERE NOT (SELECT several FROM owners)
          AND r.status = 'pending'
          AND r.provider = $2
          AND r.available_at <= coalesce($1::timestamptz, now())
          AND (NOT r.serial OR NOT EXISTS (
                SELECT 1 FROM runs o
                WHERE o.schedule_id = r.schedule_id AND o.status IN ('pending', 'running')
                  AND o.slot < r.slot))
        ORDER BY r.available_at, r.id
        LIMIT $3 /* size class */
        FOR UPDATE SKIP LOCKED
    ) one
    UNION ALL
    -- Several owners: their runs round-robin (run_claim_lanes), so no owner's backlog starves
    -- another's due runs (docs/reliability.md, "Fair to every owner").
    SELECT id
    FROM run_claim_lanes($2, coalesce($1::timestamptz, now()), $3::integer) AS id
    WHERE (SELECT several FROM owners)
), claimed AS (
    UPDATE runs r
    SET status = 'running',
        attempt_id = gen_random_uuid(),
        attempts = r.attempts + 1,
        worker_id = $4,
        lease_expires_at = coalesce($1::timestamptz, now()) + $5::interval,
        deadline_at = coalesce($1::timestamptz, now()) + s.timeout,
        started_at = coalesce(r.started_at, coalesce($1::timestamptz, now())),
        attempt_started_at = coalesce($1::timestamptz, now())
    FROM schedules s
    WHERE r.id = ANY (ARRAY(SELECT id FROM candidates LIMIT $3)) AND s.id = r.schedule_id
    -- The schedule as the worker needs it (re-read at claim time, invariant 7), returned by
    -- the update that already joins it: a second join costs the planner on every claim.
    RETURNING r.id, r.schedule_id, r.slot, r.attempt_id, r.attempts, r.releases,
              r.max_attempts, s.name, s.prompt,
              -- the model of the run's place in its route (0023_provider_weather.sql)
              CASE WHEN r.route = 0 THEN s.model ELSE r.model END AS model,
              s.params, s.timezone, s.enabled,
              extract(epoch FROM s.timeout)::float8 AS timeout_seconds,
              extract(epoch FROM (coalesce($1::timestamptz, now()) - r.slot))::float8
                  AS start_lag,
              -- NULL unless a budget of the schedule or its owner is reached (0011_budgets.sql);
              -- read only where a budget exists, the owners' test once per statement.
              CASE WHEN s.budget IS NULL AND NOT (SELECT EXISTS (SELECT 1 FROM owner_budgets))
                   THEN NULL
                   ELSE budget_verdict(s.id, s.owner, s.budget, coalesce($1::timestamptz, now()))
              END AS over_budget,
              s.vars, s.followup_key, s.output_schema, s.notify_when, r.throttles, r.route,
              s.fallback, s.provider AS schedule_provider, s.model AS schedule_model,
              extract(epoch FROM s.give_up_after)::float8 AS give_up_seconds,
              extract(epoch FROM (coalesce($1::timestamptz, now()) - r.started_at))::float8
                  AS running_for
), seen AS (
    -- A full claim met no contention worth counting and skips the second read: CASE
    -- evaluates its ELSE branch only when it is reached. run_claimable_count
    -- (0016_claimable_count.sql) repeats the candidates' predicate; keep the two the same.
    SELECT CASE WHEN (SELECT count(*) FROM claimed) >= $3 THEN $3::int
                ELSE run_claimable_count($2, coalesce($1::timestamptz, now()), $3::integer)
           END AS claimable
)
-- The claim's commit does not wait for its WAL flush (docs/reliability.md, "Which commits
-- wait"): a claim lost to a database crash was never acted on durably, since its attempt's
-- finish, which does wait, flushes the WAL up to and past it.
SELECT c.*, seen.claimable
FROM seen
CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS quick
LEFT JOIN claimed c ON true;

-- name: run_claim_limited
-- run_claim_batch for a provider with fleet-wide limits (docs/providers.md), in one round trip:
-- provider_admit takes the provider's advisory lock and says how many of the $3 wanted runs
-- its running runs ($6 at most), its rate bucket ($7 per second, burst $8), its LLM-token
-- bucket ($9 tokens a minute) and its breaker leave; the claim takes at most that many, and
-- the rate bucket is written back less what it took (the LLM tokens are debited when each
-- attempt ends: provider_debit_tokens). The lock is held until this statement commits, so
-- the next claimer counts these runs. $10/$11: the claimer's runs (ids, attempts) whose call
-- has returned, their final write on its way: they are no call in flight, and provider_admit
-- does not count them (0034_provider_admit_calls_in_flight.sql). The candidates' LIMIT is the
-- size class of $3, as in run_claim_batch; the update takes what provider_admit allowed of
-- them (no more than $3), and since the candidates are read lazily, only those are locked.
WITH admit AS (
    -- Takes the provider's advisory lock and reads its room (0014_provider_tokens.sql).
    SELECT * FROM provider_admit($2, $3, $6, $7, $8, $9, $1, $10::bigint[], $11::uuid[])
), owners AS (
    -- Whether another owner than the first in claim order has runs waiting, as in
    -- run_claim_batch.
    SELECT coalesce((SELECT true FROM runs r
                     WHERE r.status = 'pending' AND r.provider = $2 AND r.owner < head.owner
                       AND r.available_at <= coalesce($1::timestamptz, now())
                     ORDER BY r.owner DESC LIMIT 1)
                    OR (SELECT true FROM runs r
                        WHERE r.status = 'pending' AND r.provider = $2 AND r.owner > head.owner
                          AND r.available_at <= coalesce($1::timestamptz, now())
                        ORDER BY r.owner LIMIT 1), false) AS several
    FROM (SELECT (SELECT r.owner FROM runs r
                  WHERE r.status = 'pending' AND r.provider = $2
                    AND r.available_at <= coalesce($1::timestamptz, now())
                  ORDER BY r.available_at, r.id LIMIT 1) AS owner) AS head
), candidates AS (
    SELECT one.id FROM (
        SELECT r.id
        FROM runs r
        WHERE NOT (SELECT several FROM owners)
          AND r.status = 'pending'
          AND r.provider = $2
          AND r.available_at <= coalesce($1::timestamptz, now())
          AND (NOT r.serial OR NOT EXISTS (
                SELECT 1 FROM runs o
                WHERE o.schedule_id = r.schedule_id AND o.status IN ('pending', 'running')
                  AND o.slot < r.slot))
        ORDER BY r.available_at, r.id
        LIMIT $3 /* size class */
        FOR UPDATE SKIP LOCKED
    ) one
    UNION ALL
    -- Several owners: round-robin, as in run_claim_batch, and only as many as were allowed.
    SELECT id
    FROM run_claim_lanes($2, coalesce($1::timestamptz, now()),
                         least($3::integer, (SELECT allowed FROM admit))) AS id
    WHERE (SELECT several FROM owners) AND (SELECT allowed FROM admit) > 0
), claimed AS (
    UPDATE runs r
    SET status = 'running',
        attempt_id = gen_random_uuid(),
        attempts = r.attempts + 1,
        worker_id = $4,
        lease_expires_at = coalesce($1::timestamptz, now()) + $5::interval,
        deadline_at = coalesce($1::timestamptz, now()) + s.timeout,
        started_at = coalesce(r.started_at, coalesce($1::timestamptz, now())),
        attempt_started_at = coalesce($1::timestamptz, now())
    FROM schedules s
    WHERE r.id = ANY (ARRAY(SELECT id FROM candidates LIMIT (SELECT allowed FROM admit)))
      AND s.id = r.schedule_id
    -- The schedule as the worker needs it (re-read at claim time, invariant 7), returned by
    -- the update that already joins it: a second join costs the planner on every claim.
    RETURNING r.id, r.schedule_id, r.slot, r.attempt_id, r.attempts, r.releases,
              r.max_attempts, s.name, s.prompt,
              -- the model of the run's place in its route (0023_provider_weather.sql)
              CASE WHEN r.route = 0 THEN s.model ELSE r.model END AS model,
              s.params, s.timezone, s.enabled,
              extract(epoch FROM s.timeout)::float8 AS timeout_seconds,
              extract(epoch FROM (coalesce($1::timestamptz, now()) - r.slot))::float8
                  AS start_lag,
              -- NULL unless a budget of the schedule or its owner is reached (0011_budgets.sql);
              -- read only where a budget exists, the owners' test once per statement.
              CASE WHEN s.budget IS NULL AND NOT (SELECT EXISTS (SELECT 1 FROM owner_budgets))
                   THEN NULL
                   ELSE budget_verdict(s.id, s.owner, s.budget, coalesce($1::timestamptz, now()))
              END AS over_budget,
              s.vars, s.followup_key, s.output_schema, s.notify_when, r.throttles, r.route,
              s.fallback, s.provider AS schedule_provider, s.model AS schedule_model,
              extract(epoch FROM s.give_up_after)::float8 AS give_up_seconds,
              extract(epoch FROM (coalesce($1::timestamptz, now()) - r.started_at))::float8
                  AS running_for
), spend AS (
    -- The rate bucket after this claim took its runs' tokens (under the same lock).
    INSERT INTO provider_buckets (provider, tokens, updated_at)
    SELECT $2, a.tokens - (SELECT count(*) FROM claimed), coalesce($1::timestamptz, clock_timestamp())
    FROM admit a WHERE a.tokens IS NOT NULL
    ON CONFLICT (provider) DO UPDATE
    SET tokens = excluded.tokens,
        updated_at = greatest(provider_buckets.updated_at, excluded.updated_at)
), seen AS (
    -- A full claim met no contention worth counting and skips the second read: CASE
    -- evaluates its ELSE branch only when it is reached. run_claimable_count
    -- (0016_claimable_count.sql) repeats the candidates' predicate; keep the two the same.
    SELECT CASE WHEN (SELECT count(*) FROM claimed) >= $3 THEN $3::int
                ELSE run_claimable_count($2, coalesce($1::timestamptz, now()), $3::integer)
           END AS claimable
)
SELECT c.*, seen.claimable, a.allowed, a.running AS provider_running, a.open_for,
       a.half_open, a.failures, a.llm_tokens, a.paced_for, a.ramp, a.rate,
       a.tokens AS rate_tokens
FROM seen
CROSS JOIN admit a
-- Commits without waiting for its WAL flush, as run_claim_batch.
CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS quick
LEFT JOIN claimed c ON true;


-- name: run_heartbeat_many
-- Renew the leases this process still holds. A run missing from the result was taken from
-- us (reaped, released or finished by another attempt): the caller fences that attempt.
-- A renewal does not wait for its WAL flush: one lost to a database crash only lets the
-- lease end sooner, which is what a lease is for.
-- A lease is never renewed past the attempt's deadline plus one lease: a worker that does
-- not stop an attempt at its timeout loses it then, and the reaper, which reads leases
-- only (run_reap_expired), takes the run back.
-- Each run is reached by its primary key, whatever the statistics say: see run_finish_many
-- for why the guard is written as one condition on the run and its input row together.
WITH renewed AS (
    UPDATE runs r
    SET lease_expires_at = least(coalesce($1::timestamptz, now()), r.deadline_at)
                           + $4::interval
    FROM unnest($2::bigint[], $3::uuid[]) AS h(id, attempt_id)
    WHERE r.id = ANY (ARRAY[h.id]) AND h.attempt_id IS NOT NULL
      AND CASE WHEN r.status = 'running' THEN r.attempt_id END IS NOT DISTINCT FROM h.attempt_id
    RETURNING r.id, r.cancel_requested
)
SELECT renewed.* FROM renewed
CROSS JOIN (SELECT set_config('synchronous_commit', 'off', true)) AS quick;

-- name: run_finish_many
-- Finalize a batch of attempts of worker $13, each guarded by its fencing token: a row missing
-- from the result was stale and changed nothing. Per row, status is the run's next state:
-- succeeded | dead | cancelled | skipped | pending (a retry, available again after retry_in).
-- A succeeded attempt stays in the run row (attempt_id, worker_id, attempt_started_at), so the
-- happy path writes this one row; any other ending writes its attempt's own row, since the
-- run row will not tell it (0013_two_writes_per_run.sql). An ended attempt records the
-- provider and model it used ($17, $18), whether it was throttled ($19: it then counts in
-- runs.throttles, not against max_attempts) and how long it was asked to wait ($20); a retry
-- may move the run to another place of its route ($21 route, $22 provider, $23 model; NULL
-- route: it stays where it is), 0023_provider_weather.sql. $24: characters the attempt's
-- text needed replaced to be storable (promptsched/storable.py), NULL when none.
WITH input AS (
    SELECT *
    FROM unnest($2::bigint[], $3::uuid[], $4::text[], $5::text[], $6::jsonb[], $7::text[],
                $8::interval[], $9::text[], $10::text[], $11::jsonb[], $12::jsonb[],
                $14::jsonb[], $15::jsonb[], $16::jsonb[], $17::text[], $18::text[],
                $19::boolean[], $20::interval[], $21::integer[], $22::text[], $23::text[],
                $24::integer[])
         AS i(id, attempt_id, status, output, usage, error, retry_in, skip_reason,
              attempt_status, notice, followup, output_json, decision, watch,
              provider, model, throttled, wait, next_route, next_provider, next_model, cleaned)
    WHERE attempt_id IS NOT NULL
), decided AS MATERIALIZED (
    -- A `changed` monitor's success is decided against its schedule's memory before its
    -- update (monitor_decide, 0021_monitor_decide.sql; it locks the rows it decides for, so
    -- it decides for exactly the rows this update then finds current). Nothing to decide: an
    -- empty call.
    SELECT d.id, d.decision
    FROM monitor_decide(ARRAY(SELECT id FROM input WHERE watch IS NOT NULL
                                                    AND status = 'succeeded'),
                        ARRAY(SELECT attempt_id FROM input WHERE watch IS NOT NULL
                                                            AND status = 'succeeded'),
                        ARRAY(SELECT watch FROM input WHERE watch IS NOT NULL
                                                       AND status = 'succeeded'),
                        coalesce($1::timestamptz, now())) AS d
), finished AS (
    UPDATE runs r
    SET status = i.status,
        output = CASE WHEN i.status = 'succeeded' THEN i.output ELSE r.output END,
        output_json = CASE WHEN i.status = 'succeeded' THEN i.output_json ELSE r.output_json END,
        notify_decision = CASE WHEN i.status = 'succeeded' THEN coalesce(d.decision, i.decision)
                          END,
        usage = CASE WHEN i.status = 'succeeded' THEN i.usage ELSE r.usage END,
        -- totals over every attempt, whatever its outcome (the usage carries its cost)
        tokens = r.tokens + coalesce((i.usage ->> 'total_tokens')::bigint, 0),
        cost = r.cost + coalesce((i.usage ->> 'cost')::float8, 0),
        -- characters replaced to make what the attempts stored storable, over every attempt
        -- ($24, NULL: none; 0035_run_cleaned_chars.sql)
        cleaned_chars = CASE WHEN i.cleaned IS NULL THEN r.cleaned_chars
                             ELSE coalesce(r.cleaned_chars, 0) + i.cleaned END,
        error = i.error,
        skip_reason = i.skip_reason,
        available_at = CASE WHEN i.retry_in IS NULL THEN r.available_at
                            ELSE coalesce($1::timestamptz, now()) + i.retry_in END,
        finished_at = CASE WHEN i.status = 'pending' THEN NULL
                           ELSE coalesce($1::timestamptz, now()) END,
        attempt_id = CASE WHEN i.status = 'pending' THEN NULL ELSE r.attempt_id END,
        lease_expires_at = NULL,
        worker_id = CASE WHEN i.status = 'succeeded' THEN r.worker_id END,
        cancel_requested = false,
        throttles = r.throttles + CASE WHEN i.throttled THEN 1 ELSE 0 END,
        route = coalesce(i.next_route, r.route),
        provider = coalesce(i.next_provider, r.provider),
        -- a success records the model it used (0025_attempt_model.sql)
        model = CASE WHEN i.status = 'succeeded' THEN coalesce(i.model, r.model)
                     WHEN i.next_route IS NULL THEN r.model ELSE i.next_model END
    FROM input i
    LEFT JOIN decided d ON d.id = i.id
    -- Each input row reaches its run by primary key and by nothing else, whatever the
    -- statistics say, so the statement costs what its batch does however many runs are in
    -- flight (docs/performance.md, "Plans that stay right"). `= ANY (ARRAY[i.id])` can drive
    -- no hash or merge join, and the fencing guard (the run still runs this very attempt) is
    -- one condition on the run and its input row together: written as `status = 'running'
    -- AND attempt_id = i.attempt_id`, statistics taken while few runs were running (right
    -- after a rush) made a scan of every running run, once per batch row, look cheaper.
    WHERE r.id = ANY (ARRAY[i.id])
      AND CASE WHEN r.status = 'running' THEN r.attempt_id END IS NOT DISTINCT FROM i.attempt_id
    RETURNING r.id, r.schedule_id, r.status, r.attempts, r.attempt_started_at, i.attempt_id,
              i.attempt_status, i.error, i.usage, i.notice, i.followup, r.notify_decision,
              i.provider, i.model, i.throttled, i.wait
), ended AS (
    INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at,
                                finished_at, error, usage, provider, model, throttled, wait)
    SELECT f.attempt_id, f.id, f.attempts, $13, f.attempt_status, f.attempt_started_at,
           coalesce($1::timestamptz, now()), f.error, f.usage, f.provider, f.model,
           coalesce(f.throttled, false), f.wait
    FROM finished f
    WHERE f.status <> 'succeeded'
), owed AS (
    -- Invariant 5: what the finished runs owe (outbox_owe, 0007_outbox_owe.sql) is written by
    -- this very statement, so the outbox rows exist exactly when the finish landed.
    SELECT outbox_owe(array_agg(f.id), array_agg(f.schedule_id), array_agg(f.status),
                      coalesce($1::timestamptz, now()), array_agg(f.notify_decision)) AS written
    FROM finished f
), noticed AS (
    -- A run skipped for a reached budget owes one notice per scope and period (budget_owe,
    -- 0011_budgets.sql): the period's first skip writes it, every later one changes nothing.
    SELECT budget_owe(array_agg(f.id), array_agg(f.schedule_id), array_agg(f.notice),
                      coalesce($1::timestamptz, now())) AS written
    FROM finished f
    WHERE f.notice IS NOT NULL
), checked AS (
    -- A follow-up's check that ended records its decision, and writes the next check or
    -- ends the follow-up (followup_record, 0012_followups.sql as replaced by
    -- 0015_followup_recheck_resolution.sql), in this same statement.
    SELECT followup_record(array_agg(f.id), array_agg(f.schedule_id), array_agg(f.status),
                           array_agg(f.followup -> 'decision'),
                           coalesce($1::timestamptz, now())) AS written
    FROM finished f
    WHERE f.followup IS NOT NULL AND f.status <> 'pending'
), woke AS (
    -- NOTIFY is delivered at commit: a notifier never wakes before the rows are visible.
    -- (A join, not subqueries under OR: every function must run whatever the first says.)
    SELECT pg_notify('promptsched_outbox', 'finish')
    FROM owed CROSS JOIN noticed CROSS JOIN checked
    WHERE owed.written > 0 OR noticed.written > 0 OR checked.written > 0
)
SELECT coalesce(array_agg(id), '{}') AS landed, (SELECT count(*) FROM woke)::int AS woken
FROM finished;

-- name: run_release_many
-- Drain: hand runs back at once so another replica claims them without waiting for the
-- lease to expire. A released attempt does not count against max_attempts; it is written to
-- its own row (the run row's next claim overwrites the attempt it holds).
WITH released AS (
    UPDATE runs r
    SET status = 'pending', attempt_id = NULL, lease_expires_at = NULL, worker_id = NULL,
        available_at = coalesce($1::timestamptz, now()), releases = r.releases + 1
    FROM unnest($2::bigint[], $3::uuid[]) AS h(id, attempt_id)
    -- By primary key whatever the statistics say (run_finish_many).
    WHERE r.id = ANY (ARRAY[h.id]) AND h.attempt_id IS NOT NULL
      AND CASE WHEN r.status = 'running' THEN r.attempt_id END IS NOT DISTINCT FROM h.attempt_id
    RETURNING r.id, h.attempt_id, r.attempts, r.attempt_started_at, r.provider
), attempts AS (
    INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at,
                                finished_at, error, provider)
    SELECT attempt_id, id, attempts, $4, 'released', attempt_started_at,
           coalesce($1::timestamptz, now()), 'released: the worker shut down', provider
    FROM released
)
SELECT count(*)::int FROM released;

-- name: run_reap_expired
-- Runs whose lease expired go back to pending, or to dead when their attempts are used up.
-- The lost attempt is written to its own row, as lost. A lease expires when its worker died
-- or froze, or, as a backstop for the worker's own timeout, one lease after the attempt's
-- deadline: renewals stop there (run_heartbeat_many). So expired leases are all there is
-- to read, in runs_lease_idx order from the oldest: the reap costs what it takes back,
-- however many runs are in flight. `lease_lost` tells the two apart: a lease that ended
-- before the deadline plus the grace $3 (the lease the workers renew, PROMPTSCHED_LEASE)
-- was its worker's; one that reached it was cut short by the deadline.
WITH expired AS (
    SELECT id, attempt_id, worker_id, attempts, attempt_started_at,
           coalesce(lease_expires_at < deadline_at + $3::interval, true) AS lease_lost
    FROM runs
    -- A lease is held only while the run runs (0026_lease_means_running.sql): this reads
    -- runs_lease_idx and nothing else.
    WHERE lease_expires_at IS NOT NULL AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE runs r
    -- A run asked to cancel whose worker died ends cancelled, as its worker would have.
    SET status = CASE WHEN r.cancel_requested THEN 'cancelled'
                      -- throttled attempts do not count (0023_provider_weather.sql)
                      WHEN r.attempts - r.releases - r.throttles >= r.max_attempts THEN 'dead'
                      ELSE 'pending' END,
        error = CASE WHEN r.cancel_requested THEN 'cancelled; its worker was lost'
                     WHEN e.lease_lost THEN 'lease expired: the worker was lost'
                     ELSE 'timed out: the worker did not stop the attempt' END,
        finished_at = CASE WHEN r.cancel_requested
                             OR r.attempts - r.releases - r.throttles >= r.max_attempts
                           THEN coalesce($1::timestamptz, now()) END,
        cancel_requested = false,
        available_at = coalesce($1::timestamptz, now()),
        attempt_id = NULL, lease_expires_at = NULL, worker_id = NULL
    FROM expired e
    WHERE r.id = e.id
    RETURNING r.id, r.schedule_id, r.status, r.provider, e.attempt_id, e.worker_id,
              e.lease_lost, e.attempts, e.attempt_started_at
), lost AS (
    INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at,
                                finished_at, error, provider)
    SELECT attempt_id, id, attempts, worker_id, 'lost', attempt_started_at,
           coalesce($1::timestamptz, now()),
           CASE WHEN lease_lost THEN 'lease expired' ELSE 'deadline passed' END, provider
    FROM reaped
), owed AS (
    -- Invariant 5, as run_finish_many: a reaped run that went dead owes its failure
    -- notifications, written by the reap itself (a retry or a cancel owes nothing).
    SELECT outbox_owe(array_agg(r.id), array_agg(r.schedule_id), array_agg(r.status),
                      coalesce($1::timestamptz, now())) AS written
    FROM reaped r
), checked AS (
    -- A follow-up's check that the reap made final (dead, or cancelled) ends the follow-up
    -- with that reason, as the finish would have (followup_record, 0012_followups.sql).
    SELECT followup_record(array_agg(r.id), array_agg(r.schedule_id), array_agg(r.status),
                           array_agg(NULL::jsonb), coalesce($1::timestamptz, now())) AS written
    FROM reaped r
    WHERE r.status IN ('dead', 'cancelled')
), woke AS (
    -- (A join: both functions run whatever the first wrote.)
    SELECT pg_notify('promptsched_outbox', 'reap')
    FROM owed CROSS JOIN checked
    WHERE owed.written > 0 OR checked.written > 0
)
SELECT id, schedule_id, status, provider, attempt_id, worker_id, lease_lost,
       (SELECT count(*) FROM woke)::int AS woken
FROM reaped;

-- name: run_seconds_until_available
-- The earliest pending run of any of the providers $2: the first runs_claim_idx entry of
-- each, one probe per provider (a min() over `provider = ANY` read every pending run).
SELECT extract(epoch FROM (min(first.available_at) - coalesce($1::timestamptz, now())))::float8
FROM unnest($2::text[]) AS p(provider)
CROSS JOIN LATERAL (
    SELECT r.available_at FROM runs r
    WHERE r.status = 'pending' AND r.provider = p.provider
    ORDER BY r.available_at
    LIMIT 1
) AS first;

-- name: run_reroute_held
-- Runs waiting for provider $2 while its breaker is open or its headers paced it move on to
-- the next place of their schedule's route that can take them now (docs/providers.md,
-- "Fallback providers"): a provider this process knows ($4), other than $2, whose breaker is
-- not open and which is not paced; the first such place after the run's own, in route order
-- (after the last, the schedule's own provider again). At most $3 runs, available now, of
-- schedules that name a fallback (schedules_fallback_idx, 0031_reroute_held.sql), each
-- schedule's waiting runs read through runs_unfinished_idx: the move costs what those runs
-- do. Runs another claimer holds are skipped. Returns each moved run and where it went.
WITH candidates AS (
    SELECT w.id, w.route, s.provider AS home, s.model AS home_model, s.fallback
    FROM schedules s
    CROSS JOIN LATERAL (
        SELECT r.id, r.route FROM runs r
        WHERE r.schedule_id = s.id AND r.status IN ('pending', 'running')
          AND r.status = 'pending' AND r.provider = $2
          AND r.available_at <= coalesce($1::timestamptz, now())
        ORDER BY r.slot
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS w
    WHERE cardinality(s.fallback) > 0
    LIMIT $3
), moves AS (
    SELECT c.id, nxt.route, nxt.provider, nxt.model
    FROM candidates c
    CROSS JOIN LATERAL (
        SELECT p.route, p.provider, p.model
        FROM generate_series(1, cardinality(c.fallback)) AS step
        CROSS JOIN LATERAL (
            SELECT (c.route + step) % (cardinality(c.fallback) + 1) AS route
        ) AS at
        CROSS JOIN LATERAL (
            SELECT at.route,
                   CASE WHEN at.route = 0 THEN c.home
                        ELSE split_part(c.fallback[at.route], ':', 1) END AS provider,
                   CASE WHEN at.route = 0 THEN c.home_model
                        WHEN strpos(c.fallback[at.route], ':') > 0
                        THEN substr(c.fallback[at.route], strpos(c.fallback[at.route], ':') + 1)
                   END AS model
        ) AS p
        WHERE p.provider <> $2 AND p.provider = ANY ($4::text[])
          AND NOT EXISTS (
                SELECT 1 FROM provider_buckets b
                WHERE b.provider = p.provider
                  AND (b.open_until > coalesce($1::timestamptz, now())
                       OR b.paced_until > coalesce($1::timestamptz, now())))
        ORDER BY step
        LIMIT 1
    ) AS nxt
)
UPDATE runs r
SET route = m.route, provider = m.provider, model = m.model
FROM moves m
WHERE r.id = ANY (ARRAY[m.id]) AND r.status = 'pending' AND r.provider = $2
RETURNING r.id, r.provider;

-- name: run_notify_ready
SELECT pg_notify('promptsched_runs', $1::text);

-- name: run_analyze_outgrown
-- A rush has written $1 run rows: analyze runs if its statistics know fewer (0018). The row
-- count they knew before, when that was the case; no row otherwise.
SELECT known::float8 FROM runs_analyze_outgrown($1) AS known WHERE known < $1;

-- name: run_list
SELECT r.id, r.schedule_id, r.slot, r.origin, r.status, r.skip_reason, r.missed_slots,
       r.attempts, r.max_attempts, r.error, r.output, r.available_at, r.created_at,
       r.started_at, r.finished_at, r.replay_of, r.throttles, r.tokens, r.cost, r.output_json,
       r.notify_decision
FROM runs r
JOIN schedules s ON s.id = r.schedule_id
WHERE ($1::bigint IS NULL OR r.schedule_id = $1)
  AND ($2::text IS NULL OR r.status = $2)
  AND ($3::text IS NULL OR s.owner = $3)
  AND ($4::bigint IS NULL OR r.id < $4)
ORDER BY r.id DESC
LIMIT $5;

-- name: run_get
SELECT r.* FROM runs r JOIN schedules s ON s.id = r.schedule_id
WHERE r.id = $1 AND ($2::text IS NULL OR s.owner = $2);

-- name: run_output
-- A run's whole output and its status, owner-scoped as run_get (GET /v1/runs/{id}/output).
SELECT r.output, r.status FROM runs r JOIN schedules s ON s.id = r.schedule_id
WHERE r.id = $1 AND ($2::text IS NULL OR s.owner = $2);

-- name: run_attempts_list
SELECT * FROM run_attempts WHERE run_id = $1 ORDER BY number;

-- name: run_lost_among
-- Of these runs (a page of them), those with an attempt lost: its worker stopped renewing its
-- lease (a crash, a restart). ended_attempts_run_id_number_key serves the lookup.
SELECT DISTINCT run_id FROM ended_attempts WHERE run_id = ANY($1::bigint[]) AND status = 'lost';

-- name: run_seconds_until_lease_expiry
-- The first entry of runs_lease_idx: a lease never outlives its deadline plus one lease
-- (run_heartbeat_many), so the earliest lease is the reaper's next look. No row when nothing
-- runs. ORDER BY and LIMIT rather than min(): with few running runs expected (statistics
-- taken before a burst), min() was planned as a read of every lease.
SELECT extract(epoch FROM (lease_expires_at - coalesce($1::timestamptz, now())))::float8
FROM runs
WHERE lease_expires_at IS NOT NULL
ORDER BY lease_expires_at
LIMIT 1;

-- name: run_insert_manual
-- Trigger now: a run outside the cadence, marked manual, so it never collides with a slot.
INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at, serial,
                  owner)
SELECT id, coalesce($2::timestamptz, now()), 'manual', provider, max_attempts,
       coalesce($2::timestamptz, now()), false, owner
FROM schedules
WHERE id = $1
RETURNING *;

-- name: run_insert_backfill
-- Backfill: past slots as runs marked backfill; a slot that already has a cadence or backfill
-- run is left alone. Unless overlap is allow, they run one after another (serial).
INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, available_at, serial,
                  owner)
SELECT s.id, b.slot, 'backfill', s.provider, s.max_attempts, coalesce($3::timestamptz, now()),
       s.overlap_policy <> 'allow', s.owner
FROM schedules s, unnest($2::timestamptz[]) AS b(slot)
WHERE s.id = $1
  AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.schedule_id = s.id AND c.slot = b.slot
                  AND c.origin IN ('cadence', 'backfill'))
ON CONFLICT (schedule_id, slot) WHERE origin = 'backfill' DO NOTHING
RETURNING id, slot;

-- name: run_previous_success
-- The latest successful run before a slot, for the {{ previous_* }} template variables: its
-- output's first $3 characters and its whole length (a long answer is not read whole).
SELECT finished_at, slot, left(output, $3) AS output, length(output) AS output_chars FROM runs
WHERE schedule_id = $1 AND slot < $2 AND status = 'succeeded'
ORDER BY slot DESC
LIMIT 1;

-- name: run_purge_finished
-- History retention: delete finished runs (with their attempts and notifications) older than
-- the retention, a bounded batch at a time, oldest first along runs_finished_idx.
WITH old AS (
    SELECT id FROM runs
    WHERE finished_at IS NOT NULL AND finished_at < coalesce($1::timestamptz, now()) - $2::interval
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM runs r USING old WHERE r.id = old.id RETURNING r.id
), ended AS (
    -- A follow-up that ended longer ago than the retention goes with its schedule, its
    -- ledger of checks and what runs are left (followups_ended_idx).
    SELECT schedule_id FROM followups
    WHERE state <> 'active' AND updated_at < coalesce($1::timestamptz, now()) - $2::interval
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), dropped AS (
    DELETE FROM schedules s USING ended e WHERE s.id = e.schedule_id RETURNING s.id
)
SELECT (SELECT count(*) FROM gone)::int + (SELECT count(*) FROM dropped)::int;

-- name: provider_trip
-- A failure of one of the provider's attempts ($7: when it started), seen by any replica. One
-- burst is one event: an attempt that started before the breaker last opened (opened_at) is
-- part of what opened it, and changes nothing (no row comes back). A throttled answer ($8: a
-- 429, a 503 with Retry-After) opens the breaker at once: for $3 seconds when the provider said
-- how long (Retry-After, or its rate-limit headers), else for $9 seconds doubling per
-- throttled answer in a row, up to $6. Other failures count, and open it after $4 in a row, for
-- $5 seconds doubling per further failure up to $6. Each opening restarts the fleet's allowed
-- concurrency at one (ramp). A throttled answer after a success also marks the window that
-- ended with it for learning the provider's rate (learn_until; its length window_seconds: $3,
-- else $10), which the breaker's probe reads when it succeeds (provider_recover,
-- 0030_provider_learned_rate.sql). Returns open_until, the reason, and whether this failure
-- opened it. The instant is read once ("at"): clock_timestamp() read twice differs, and an
-- opening compared with a second reading would never be seen as this failure's.
WITH at AS MATERIALIZED (SELECT coalesce($1::timestamptz, clock_timestamp()) AS t)
INSERT INTO provider_buckets AS b (provider, failures, open_until, reason, opened_at, ramp,
                                   window_seconds, learn_until)
SELECT $2, 1,
        CASE WHEN $8::boolean OR $4::int <= 1 THEN at.t
             + make_interval(secs => coalesce($3::float8, CASE WHEN $8::boolean THEN $9::float8 ELSE $5::float8 END)) END,
        CASE WHEN $8 THEN 'throttled' WHEN $4 <= 1 THEN '1 failures in a row' END,
        CASE WHEN $8::boolean OR $4::int <= 1 THEN at.t END,
        CASE WHEN $8::boolean OR $4::int <= 1 THEN 1 END,
        CASE WHEN $8 THEN coalesce($3::float8, $10::float8) END,
        CASE WHEN $8 THEN at.t END
FROM at
ON CONFLICT (provider) DO UPDATE
SET failures = b.failures + 1,
    open_until = CASE
        WHEN $8 THEN greatest(b.open_until, (SELECT t FROM at)
             + make_interval(secs => coalesce($3::float8, least($6::float8, $9::float8 * 2 ^ b.failures))))
        WHEN b.failures + 1 >= $4 THEN greatest(b.open_until,
             (SELECT t FROM at)
             + make_interval(secs => least($6::float8, $5::float8 * 2 ^ (b.failures + 1 - $4))))
        ELSE b.open_until END,
    opened_at = CASE WHEN $8 OR b.failures + 1 >= $4
                     THEN (SELECT t FROM at) ELSE b.opened_at END,
    ramp = CASE WHEN $8 OR b.failures + 1 >= $4 THEN 1 ELSE b.ramp END,
    reason = CASE
        WHEN $8 THEN 'throttled'
        WHEN b.failures + 1 >= $4 THEN (b.failures + 1) || ' failures in a row'
        ELSE b.reason END,
    -- a throttle with no success since the last one (its probe's) keeps the window to learn
    window_seconds = CASE WHEN $8 AND (b.failures = 0 OR b.learn_until IS NULL)
                          THEN coalesce($3::float8, $10::float8) ELSE b.window_seconds END,
    learn_until = CASE WHEN $8 AND (b.failures = 0 OR b.learn_until IS NULL)
                       THEN (SELECT t FROM at) ELSE b.learn_until END
WHERE b.opened_at IS NULL OR $7::timestamptz >= b.opened_at
RETURNING open_until, reason, opened_at = (SELECT t FROM at) AS opened;

-- name: provider_recover
-- A success of an attempt that started at $3, at $5: the failure count restarts; a half-open
-- probe's ($2) also closes the breaker. While the fleet's allowed concurrency ramps back
-- (ramp), a success of an attempt started after the breaker last opened adds 1 / floor(ramp)
-- to it (about one more per round of the whole allowance: additive increase), until it
-- reaches max_concurrency ($4), where the ramp ends. The first such success after a throttle
-- learns the provider's rate from the window that ended with it (learn_until): the successes
-- of attempts started in it are the allowance the first time, and later at most the
-- allowance in force less one; pacing restarts from an empty bucket
-- (0030_provider_learned_rate.sql). Returns the ramp after it (NULL: ended).
WITH b AS (
    SELECT pb.*, $3::timestamptz >= pb.opened_at AND pb.learn_until IS NOT NULL AS learning,
           pb.learn_until - make_interval(secs => pb.window_seconds) AS learn_from
    FROM provider_buckets pb WHERE pb.provider = $1
), seen AS (
    -- the window's successes: runs_finished_idx bounds the read to what finished since
    SELECT count(*)::float8 AS n FROM b, runs r
    WHERE b.learning
      AND r.finished_at >= b.learn_from AND r.finished_at <= coalesce($5::timestamptz, clock_timestamp())
      AND r.provider = $1 AND r.status = 'succeeded'
      AND r.attempt_started_at >= b.learn_from AND r.attempt_started_at < b.learn_until
)
UPDATE provider_buckets pb
SET failures = 0,
    open_until = CASE WHEN $2 THEN NULL ELSE pb.open_until END,
    reason = CASE WHEN $2 THEN NULL ELSE pb.reason END,
    -- (1e-6: three thirds make a whole step, not 0.999...)
    ramp = CASE WHEN pb.ramp IS NULL OR $3::timestamptz < pb.opened_at THEN pb.ramp
                WHEN pb.ramp + 1 / floor(pb.ramp + 1e-6) + 1e-6 >= $4 THEN NULL
                ELSE pb.ramp + 1 / floor(pb.ramp + 1e-6) END,
    allowance = CASE WHEN NOT b.learning THEN pb.allowance
                     WHEN pb.allowance IS NULL THEN nullif(seen.n, 0)
                     ELSE greatest(1.0, least(greatest(seen.n, 1.0), provider_allowance(
                         pb.allowance, pb.window_seconds, pb.learned_at,
                         coalesce($5::timestamptz, clock_timestamp())) - 1)) END,
    learned_at = CASE WHEN b.learning THEN coalesce($5::timestamptz, clock_timestamp())
                      ELSE pb.learned_at END,
    learn_until = CASE WHEN b.learning THEN NULL ELSE pb.learn_until END,
    tokens = CASE WHEN b.learning THEN 0 ELSE pb.tokens END,
    updated_at = CASE WHEN b.learning THEN coalesce($5::timestamptz, clock_timestamp())
                      ELSE pb.updated_at END
FROM b, seen
WHERE pb.provider = $1 AND (pb.failures > 0 OR ($2 AND pb.open_until IS NOT NULL)
                            OR pb.ramp IS NOT NULL OR b.learning)
RETURNING pb.ramp;

-- name: provider_pace
-- The provider's rate-limit headers said nothing is left for $3 seconds ($4 says which
-- header): no replica sends to it before then (provider_admit).
INSERT INTO provider_buckets AS b (provider, paced_until, pace_reason)
VALUES ($2, coalesce($1::timestamptz, clock_timestamp()) + make_interval(secs => $3::float8), $4)
ON CONFLICT (provider) DO UPDATE
SET paced_until = greatest(b.paced_until, excluded.paced_until),
    pace_reason = CASE WHEN b.paced_until >= excluded.paced_until THEN b.pace_reason
                       ELSE excluded.pace_reason END;

-- name: provider_debit_tokens
-- An attempt of a provider with a tokens-per-minute limit ($3) ended having used $4 tokens:
-- its LLM-token bucket, refilled to now at $3 / 60 per second up to one second's worth, less
-- those. It may go negative (the tokens were spent already); claims wait until it is positive
-- again. One row update, so replicas' debits and claims never lose each other's writes.
INSERT INTO provider_buckets AS b (provider, llm_tokens, llm_updated_at)
VALUES ($2, $3::float8 / 60 - $4::float8, coalesce($1::timestamptz, clock_timestamp()))
ON CONFLICT (provider) DO UPDATE
SET llm_tokens = CASE
        WHEN b.llm_tokens IS NULL THEN $3::float8 / 60
        ELSE least($3::float8 / 60, b.llm_tokens + $3::float8 / 60 * greatest(0.0, extract(
                 epoch FROM coalesce($1::timestamptz, clock_timestamp()) - b.llm_updated_at
             )::float8))
        END - $4::float8,
    llm_updated_at = greatest(b.llm_updated_at, coalesce($1::timestamptz, clock_timestamp()));

-- name: provider_cooling
-- Providers whose breaker is open now, for the console.
SELECT provider, open_until, reason FROM provider_buckets
WHERE open_until > coalesce($1::timestamptz, now())
ORDER BY provider;

-- name: provider_weather
-- Every provider's fleet-wide state, for the console and `status`: its breaker (open until,
-- why, since when), its allowed concurrency while it ramps back (NULL: the configured
-- limit), until when its own headers pace it, and the requests per window it learned it
-- allows (NULL: none learned).
SELECT provider, open_until, reason, opened_at, failures, ramp, paced_until, pace_reason,
       provider_allowance(allowance, window_seconds, learned_at,
                          coalesce($1::timestamptz, now())) AS allowance, window_seconds,
       open_until IS NOT NULL AND open_until > coalesce($1::timestamptz, now()) AS open,
       open_until IS NOT NULL AND open_until <= coalesce($1::timestamptz, now()) AS half_open,
       paced_until IS NOT NULL AND paced_until > coalesce($1::timestamptz, now()) AS paced
FROM provider_buckets
ORDER BY provider;
