-- What a finish owes (outbox_owe, 0007_outbox_owe.sql) is read per schedule, not per run, and
-- only for schedules that have notifications at all. The view notify_channels computes every
-- channel of a schedule from its `notify` document; joined to each finished run, it did that
-- once per run: 0.40 ms of a 64-run finish, whether the batch came from one schedule or from
-- 64, when none of them notifies anyone (most schedules). Now the batch's schedules are
-- probed once each through the primary key (`= ANY` walks the sorted, deduplicated ids), those
-- whose `notify` is empty ('{}', the default, has no channel) go, and the channels of the rest
-- are computed once: 0.04-0.08 ms for the same finish (docs/performance.md). Same rows owed.
CREATE OR REPLACE FUNCTION outbox_owe(run_ids bigint[], schedule_ids bigint[], statuses text[],
                                      at timestamptz)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    written integer;
BEGIN
    WITH channels AS MATERIALIZED (
        SELECT c.*
        FROM notify_channels c
        WHERE c.schedule_id = ANY (ARRAY(
            SELECT s.id FROM schedules s
            WHERE s.id = ANY (schedule_ids) AND s.notify <> '{}'::jsonb))
    )
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key,
                        available_at, created_at)
    SELECT f.id, f.schedule_id, c.channel, c.target, f.status,
           format('promptsched-%s-%s-%s', f.id, f.status, c.channel), at, at
    FROM unnest(run_ids, schedule_ids, statuses) AS f (id, schedule_id, status)
    JOIN channels c ON c.schedule_id = f.schedule_id
    WHERE (f.status = 'succeeded' AND c.on_success) OR (f.status = 'dead' AND c.on_failure)
    ON CONFLICT (idempotency_key) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
