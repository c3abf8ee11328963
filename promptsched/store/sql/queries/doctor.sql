-- name: notify_url_targets
-- Every URL a schedule, or an active follow-up's escalation, notifies (webhook and chat), for
-- `promptsched doctor` to check against the address guard (PROMPTSCHED_WEBHOOK_ALLOW). A chat
-- URL is a credential: callers show its host only. A full scan: doctor is run by hand.
SELECT t.schedule_id, t.name, t.channel, t.url
FROM (
    SELECT s.id AS schedule_id, s.name, c.key AS channel, c.value ->> 'url' AS url
    FROM schedules s
    CROSS JOIN LATERAL jsonb_each(s.notify) c
    WHERE jsonb_typeof(s.notify) = 'object'
      AND c.key IN ('webhook', 'slack', 'discord', 'ntfy')
      AND jsonb_typeof(c.value -> 'url') = 'string'
    UNION ALL
    SELECT f.schedule_id, 'follow-up ' || f.key, c.key, c.value ->> 'url'
    FROM followups f
    CROSS JOIN LATERAL jsonb_array_elements(f.escalate) step
    CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(step -> 'notify') = 'object'
                                       THEN step -> 'notify' ELSE '{}'::jsonb END) c
    WHERE f.state = 'active' AND jsonb_typeof(f.escalate) = 'array'
      AND c.key IN ('webhook', 'slack', 'discord', 'ntfy')
      AND jsonb_typeof(c.value -> 'url') = 'string'
) t
ORDER BY t.schedule_id, t.channel
LIMIT $1;

-- name: notify_email_count
-- How many schedules, and active follow-ups' escalation steps, email someone.
SELECT (SELECT count(*) FROM schedules
        WHERE jsonb_typeof(notify -> 'email') = 'array'
          AND jsonb_array_length(notify -> 'email') > 0)
     + (SELECT count(*) FROM followups f
        CROSS JOIN LATERAL jsonb_array_elements(
            CASE WHEN jsonb_typeof(f.escalate) = 'array' THEN f.escalate ELSE '[]' END) step
        WHERE f.state = 'active' AND jsonb_typeof(step -> 'notify' -> 'email') = 'array'
          AND jsonb_array_length(step -> 'notify' -> 'email') > 0);

-- name: backend_pid
-- The server process this statement ran in: two transactions of one client connection that
-- see two of them went through a transaction pooler.
SELECT pg_backend_pid();
