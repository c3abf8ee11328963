-- Invariant 5 written once: the notifications that runs reaching a final state owe. Both the
-- finish (run_finish_many) and the reap (run_reap_expired) call it from the statement that
-- makes the runs final, so the outbox rows exist exactly when the state landed. One element
-- per run: its id, its schedule and its new status; a run owes `succeeded` or `dead` to each
-- of its schedule's targets (notify_channels) that asked for that event, once (the key makes
-- owing the same run's event twice a no-op). Returns how many rows it wrote.
-- PL/pgSQL, not SQL: it keeps the INSERT's plan for the session, where a SQL function with a
-- data-modifying statement is planned again at every call (measured: +0.5 ms per finish).
CREATE FUNCTION outbox_owe(run_ids bigint[], schedule_ids bigint[], statuses text[],
                           at timestamptz)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    written integer;
BEGIN
    INSERT INTO outbox (run_id, schedule_id, channel, target, event, idempotency_key,
                        available_at, created_at)
    SELECT f.id, f.schedule_id, c.channel, c.target, f.status,
           format('promptsched-%s-%s-%s', f.id, f.status, c.channel), at, at
    FROM unnest(run_ids, schedule_ids, statuses) AS f (id, schedule_id, status)
    JOIN notify_channels c ON c.schedule_id = f.schedule_id
    WHERE (f.status = 'succeeded' AND c.on_success) OR (f.status = 'dead' AND c.on_failure)
    ON CONFLICT (idempotency_key) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
