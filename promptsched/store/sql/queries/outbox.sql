-- name: outbox_reclaim_expired
-- A notifier died or froze mid-send: its claims expire and the rows become available again
-- (or dead when their attempts are used up). The message may already have gone out; the
-- re-send carries the same idempotency key, so the receiver recognises it.
WITH expired AS (
    SELECT id
    FROM outbox
    WHERE status = 'sending' AND lease_expires_at < coalesce($1::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET status = CASE WHEN o.attempts >= o.max_attempts THEN 'dead' ELSE 'pending' END,
    available_at = coalesce($1::timestamptz, now()),
    last_error = 'lease expired: the notifier was lost while sending',
    claim_token = NULL,
    lease_expires_at = NULL
FROM expired e
WHERE o.id = e.id
RETURNING o.id, o.run_id, o.channel, o.status, o.attempts;

-- name: outbox_claim_batch
-- Lock up to $2 available notifications in claim-index order, skipping rows other notifiers
-- hold, and mint a claim token for each; the ORDER BY matches outbox_claim_idx. The first
-- claim stamps the configured maximum ($4) so the row shows the limit it lives under. The
-- webhook secret, and a chat channel's URL (its credential), are read from the schedule now:
-- they are never copied into the outbox.
WITH candidates AS (
    SELECT id
    FROM outbox
    WHERE status = 'pending' AND available_at <= coalesce($1::timestamptz, now())
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE outbox o
    SET status = 'sending',
        attempts = o.attempts + 1,
        max_attempts = coalesce(o.max_attempts, $4),
        claim_token = gen_random_uuid(),
        lease_expires_at = coalesce($1::timestamptz, now()) + $3::interval
    FROM candidates c
    WHERE o.id = c.id
    RETURNING o.id, o.run_id, o.schedule_id, o.channel, o.target, o.event, o.attempts,
              o.max_attempts, o.claim_token, o.idempotency_key, o.details
)
SELECT c.*, s.name AS schedule_name, s.owner, s.timezone,
       n.notify -> 'webhook' ->> 'secret' AS webhook_secret,
       CASE WHEN c.channel IN ('slack', 'discord', 'ntfy') THEN n.notify -> c.channel ->> 'url'
       END AS chat_url,
       r.slot, r.origin, r.status AS run_status, r.attempts AS run_attempts, r.output, r.error,
       r.finished_at, r.output_json,
       p.output AS previous_output, p.output_json AS previous_json,
       fu.followup_key, fu.max_checks, fu.check_number, fu.check_outcome, fu.next_check_at
FROM claimed c
JOIN runs r ON r.id = c.run_id
JOIN schedules s ON s.id = c.schedule_id
-- A follow-up's check says where its chain stands ("check 2 of 5: not resolved, next check
-- at ..."): the ledger row that the statement finishing the run wrote (followup_record),
-- found through followup_checks_schedule_idx among the follow-up's own checks.
LEFT JOIN LATERAL (
    SELECT f.key AS followup_key, f.max_checks, k.number AS check_number,
           k.outcome AS check_outcome, k.next_at AS next_check_at
    FROM followups f
    LEFT JOIN followup_checks k ON k.schedule_id = f.schedule_id AND k.run_id = c.run_id
    WHERE f.schedule_id = c.schedule_id
) fu ON true
-- A `changed` monitor's message shows what changed since the run it was compared with.
LEFT JOIN runs p ON c.event = 'succeeded' AND p.id = (c.details ->> 'since')::bigint
-- A follow-up's escalation goes to its step's own targets (followups.escalate), the rest to
-- the schedule's.
CROSS JOIN LATERAL (
    SELECT CASE WHEN c.event = 'escalation'
                THEN (SELECT f.escalate -> (c.details ->> 'step')::int -> 'notify'
                      FROM followups f WHERE f.schedule_id = c.schedule_id)
                ELSE s.notify END AS notify
) n;

-- name: outbox_settle_many
-- Record how each claimed send ended, in one statement: sent, pending (a retry after the
-- delay) or dead. Guarded by the claim token: a row whose claim expired and was taken by
-- another notifier is missing from the result and changes nothing.
UPDATE outbox o
SET status = s.status,
    sent_at = CASE WHEN s.status = 'sent' THEN coalesce($1::timestamptz, now()) END,
    available_at = CASE WHEN s.status = 'pending'
                        THEN coalesce($1::timestamptz, now()) + coalesce(s.retry_in, interval '0')
                        ELSE o.available_at END,
    last_error = coalesce(s.error, o.last_error),
    claim_token = NULL,
    lease_expires_at = NULL
FROM unnest($2::bigint[], $3::uuid[], $4::text[], $5::interval[], $6::text[])
         AS s(id, claim_token, status, retry_in, error)
WHERE o.id = s.id AND o.claim_token = s.claim_token AND o.status = 'sending'
RETURNING o.id, o.status,
          extract(epoch FROM (coalesce($1::timestamptz, now()) - o.created_at))::float8 AS lag;

-- name: outbox_seconds_until_work
-- The next instant a notifier has something to do: a pending row comes due or a claim expires.
SELECT extract(epoch FROM (least(
           (SELECT min(available_at) FROM outbox WHERE status = 'pending'),
           (SELECT min(lease_expires_at) FROM outbox WHERE status = 'sending'))
       - coalesce($1::timestamptz, now())))::float8;

-- name: outbox_list_dead
SELECT o.id, o.run_id, o.schedule_id, s.name AS schedule_name, o.channel, o.target, o.event,
       o.status, o.attempts, o.max_attempts, o.last_error, o.idempotency_key, o.created_at,
       o.available_at
FROM outbox o
JOIN schedules s ON s.id = o.schedule_id
WHERE o.status = 'dead'
  AND ($1::text IS NULL OR s.owner = $1)
  AND ($2::bigint IS NULL OR o.id < $2)
ORDER BY o.id DESC
LIMIT $3;

-- name: outbox_list_for_run
SELECT o.id, o.run_id, o.schedule_id, o.channel, o.target, o.event, o.status, o.attempts,
       o.max_attempts, o.last_error, o.idempotency_key, o.created_at, o.available_at, o.sent_at
FROM outbox o
JOIN schedules s ON s.id = o.schedule_id
WHERE o.run_id = $1 AND ($2::text IS NULL OR s.owner = $2)
ORDER BY o.id;

-- name: outbox_get
SELECT o.id, o.run_id, o.schedule_id, o.channel, o.target, o.event, o.status, o.attempts,
       o.max_attempts, o.last_error, o.idempotency_key, o.created_at, o.available_at, o.sent_at
FROM outbox o
JOIN schedules s ON s.id = o.schedule_id
WHERE o.id = $1 AND ($2::text IS NULL OR s.owner = $2);

-- name: outbox_replay
-- A dead notification is owed again, with fresh attempts (and the maximum configured then).
-- Its target is refreshed from the schedule's current settings, so fixing a wrong address or
-- URL and replaying is enough; the idempotency key stays, so it is still the same message.
WITH replayed AS (
    UPDATE outbox o
    SET status = 'pending',
        attempts = 0,
        max_attempts = NULL,
        available_at = coalesce($1::timestamptz, now()),
        target = coalesce((SELECT c.target FROM notify_channels c
                           WHERE c.schedule_id = o.schedule_id AND c.channel = o.channel),
                          o.target)
    FROM schedules s
    WHERE o.id = $2 AND o.status = 'dead' AND s.id = o.schedule_id
      AND ($3::text IS NULL OR s.owner = $3)
    RETURNING o.id, o.run_id, o.schedule_id, o.channel, o.target, o.event, o.status,
              o.attempts, o.max_attempts, o.last_error, o.idempotency_key, o.created_at,
              o.available_at, o.sent_at
), woke AS (
    SELECT pg_notify('promptsched_outbox', 'replay') FROM (SELECT 1 FROM replayed LIMIT 1) r
)
SELECT r.*, (SELECT count(*) FROM woke)::int AS woken
FROM replayed r;

-- name: outbox_owe_digests
-- The digests owed for the last whole period (of length $2, aligned to the Unix epoch) that
-- ended at or before $1: per schedule that dropped ticks in it, the slots dropped by reason,
-- owed to each of its targets that asked for failures. A skipped row stands for itself and
-- its missed_slots; a run that did start stands for the missed_slots the misfire policy folded
-- into it (reason misfire); a tick skipped because the schedule was paused (reasons disabled and
-- paused) is not a loss. Rows
-- are counted in the period of their finished_at (a skipped row is finished when it is
-- written), found through runs_finished_idx. The key names the period, so every replica may
-- run this as often as it likes: the first one owes, the others change nothing. Also returns
-- the seconds until the next period ends, when there is something new to owe.
WITH bounds AS (
    SELECT to_timestamp(floor(extract(epoch FROM coalesce($1::timestamptz, now()))
                              / extract(epoch FROM $2::interval))
                        * extract(epoch FROM $2::interval)) AS period_end
), dropped AS (
    SELECT r.schedule_id,
           CASE WHEN r.status = 'skipped' THEN coalesce(r.skip_reason, 'unknown')
                ELSE 'misfire' END AS reason,
           sum(CASE WHEN r.status = 'skipped' THEN r.missed_slots + 1
                    ELSE r.missed_slots END)::int AS slots,
           max(r.id) AS last_run
    FROM runs r
    CROSS JOIN bounds b
    WHERE r.finished_at >= b.period_end - $2::interval AND r.finished_at < b.period_end
      AND ((r.status = 'skipped' AND coalesce(r.skip_reason, '') NOT IN ('disabled', 'paused'))
           OR (r.status <> 'skipped' AND r.missed_slots > 0))
    GROUP BY 1, 2
), per_schedule AS (
    SELECT schedule_id, jsonb_object_agg(reason, slots ORDER BY reason) AS reasons,
           sum(slots)::int AS total, max(last_run) AS run_id
    FROM dropped
    GROUP BY schedule_id
), owed AS (
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key, details,
                        available_at, created_at)
    SELECT p.run_id, p.schedule_id, c.channel, c.target, 'digest',
           format('promptsched-digest-%s-%s-%s', p.schedule_id,
                  extract(epoch FROM b.period_end)::bigint, c.channel),
           jsonb_build_object('dropped', p.reasons, 'total', p.total,
                              'period_start', b.period_end - $2::interval,
                              'period_end', b.period_end),
           coalesce($1::timestamptz, now()), coalesce($1::timestamptz, now())
    FROM per_schedule p
    CROSS JOIN bounds b
    JOIN notify_channels c ON c.schedule_id = p.schedule_id AND c.on_failure
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
), woke AS (
    SELECT pg_notify('promptsched_outbox', 'digest') FROM (SELECT 1 FROM owed LIMIT 1) o
)
SELECT (SELECT count(*) FROM owed)::int AS owed, (SELECT count(*) FROM woke)::int AS woken,
       extract(epoch FROM (b.period_end + $2::interval - coalesce($1::timestamptz, now())))::float8
           AS seconds_to_next
FROM bounds b;
