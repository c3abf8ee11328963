-- name: leader_acquire
-- Take duty $1 for holder $2 until now + $3 when nobody holds it or the holder's term has
-- expired, or renew it when $2 holds it already; a row back means $2 leads. One statement,
-- so it is correct through any pooler: when two replicas race for a free or expired row,
-- the second waits on the first's row lock and then re-checks the WHERE against the row the
-- first wrote, whose fresh expiry makes it fail.
INSERT INTO leaders AS l (name, holder, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, coalesce($4::timestamptz, now()), coalesce($4::timestamptz, now()),
        coalesce($4::timestamptz, now()) + $3::interval)
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    term = CASE WHEN l.holder = excluded.holder THEN l.term ELSE l.term + 1 END,
    acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at
                       ELSE excluded.acquired_at END,
    renewed_at = excluded.renewed_at,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at <= excluded.renewed_at
RETURNING term;

-- name: leader_release
-- Step down at once (a clean stop), so another replica need not wait for the expiry.
DELETE FROM leaders WHERE name = $1 AND holder = $2;

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
