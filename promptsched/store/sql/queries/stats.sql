-- name: stats_leader_try
-- A session-level advisory lock on the stats role's own connection: the replica holding it
-- reads the queue gauges for everyone. It is released when that connection closes (a crash
-- included), so another replica takes over at its next try.
SELECT pg_try_advisory_lock($1::bigint);

-- name: stats_session_setup
-- The stats session ends itself when idle this long (milliseconds; Postgres 14+), so a frozen
-- leader's lock is freed for another replica.
SELECT set_config('idle_session_timeout',
                  (extract(epoch FROM $1::interval) * 1000)::bigint::text, false)
WHERE current_setting('server_version_num')::int >= 140000;

-- name: stats_queue_depth
-- Every count reads only unfinished rows: pending through runs_claim_idx (it holds
-- available_at, so an index-only scan), running through runs_lease_idx. Finished history,
-- however large, is never scanned.
SELECT
    (SELECT count(*) FROM runs
     WHERE status = 'pending' AND available_at <= coalesce($1::timestamptz, now()))::bigint
        AS pending,
    (SELECT count(*) FROM runs
     WHERE status = 'pending' AND available_at > coalesce($1::timestamptz, now()))::bigint
        AS scheduled,
    (SELECT count(*) FROM runs WHERE status = 'running')::bigint AS running,
    (SELECT count(*) FROM runs
     WHERE status = 'running' AND lease_expires_at < coalesce($1::timestamptz, now()))::bigint
        AS lease_expired,
    (SELECT count(*) FROM runs
     WHERE status = 'running' AND deadline_at < coalesce($1::timestamptz, now()))::bigint
        AS deadline_passed;

-- name: stats_oldest_pending
-- Age of the oldest claimable run per provider. A loose index scan over runs_claim_idx
-- (provider, available_at, id): the recursive CTE jumps from one provider to the next with
-- one index probe each, then one more probe finds each provider's oldest available_at, so
-- the cost grows with the number of providers, not with the backlog. A provider whose
-- pending runs all wait for a future available_at reports age 0.
WITH RECURSIVE providers AS (
    (SELECT provider FROM runs WHERE status = 'pending' ORDER BY provider LIMIT 1)
    UNION ALL
    SELECT (SELECT r.provider FROM runs r
            WHERE r.status = 'pending' AND r.provider > p.provider
            ORDER BY r.provider LIMIT 1)
    FROM providers p
    WHERE p.provider IS NOT NULL
)
SELECT p.provider,
       coalesce(extract(epoch FROM (coalesce($1::timestamptz, now()) - o.oldest)), 0)::float8
           AS age
FROM providers p
LEFT JOIN LATERAL (
    SELECT r.available_at AS oldest FROM runs r
    WHERE r.status = 'pending' AND r.provider = p.provider
      AND r.available_at <= coalesce($1::timestamptz, now())
    ORDER BY r.available_at
    LIMIT 1
) o ON true
WHERE p.provider IS NOT NULL;

-- name: stats_outbox_depth
-- Undelivered notifications by status; each status has its own partial index (outbox_claim_idx,
-- outbox_lease_idx, outbox_dead_idx), so sent history is never scanned.
SELECT status, count(*)::bigint AS count
FROM outbox
WHERE status IN ('pending', 'sending', 'dead')
GROUP BY status;
