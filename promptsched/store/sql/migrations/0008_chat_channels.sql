-- Chat channels: Slack and Discord incoming webhooks and ntfy topics become notify targets of
-- their own (`"slack": {"url": ...}`, `"discord": {"url": ...}`, `"ntfy": {"url": ...}` in
-- schedules.notify), owed and delivered
-- through the same outbox as email and webhooks, with the same idempotency key per channel.
-- An incoming-webhook URL is itself the credential, so the outbox never stores it: the target
-- it records is only the host (for listings of dead notifications); the notifier reads the URL
-- from the schedule when it sends, as it reads a webhook's secret.

ALTER TABLE outbox DROP CONSTRAINT outbox_channel_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_channel_check
    CHECK (channel IN ('email', 'webhook', 'slack', 'discord', 'ntfy'));

CREATE OR REPLACE VIEW notify_channels AS
SELECT s.id AS schedule_id,
       c.channel,
       c.target,
       CASE WHEN jsonb_typeof(s.notify -> 'on_success') = 'boolean'
            THEN (s.notify -> 'on_success')::boolean ELSE true END AS on_success,
       CASE WHEN jsonb_typeof(s.notify -> 'on_failure') = 'boolean'
            THEN (s.notify -> 'on_failure')::boolean ELSE true END AS on_failure
FROM schedules s
CROSS JOIN LATERAL (VALUES
    ('email',
     CASE WHEN jsonb_typeof(s.notify -> 'email') = 'array'
               AND jsonb_array_length(s.notify -> 'email') > 0
          THEN s.notify -> 'email' END),
    ('webhook',
     CASE WHEN jsonb_typeof(s.notify -> 'webhook') = 'object'
               AND jsonb_typeof(s.notify -> 'webhook' -> 'url') = 'string'
          THEN (s.notify -> 'webhook') - 'secret' END),
    ('slack',
     CASE WHEN jsonb_typeof(s.notify -> 'slack' -> 'url') = 'string'
          THEN jsonb_build_object('host', coalesce(
              substring(s.notify -> 'slack' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END),
    ('discord',
     CASE WHEN jsonb_typeof(s.notify -> 'discord' -> 'url') = 'string'
          THEN jsonb_build_object('host', coalesce(
              substring(s.notify -> 'discord' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END),
    ('ntfy',
     CASE WHEN jsonb_typeof(s.notify -> 'ntfy' -> 'url') = 'string'
          THEN jsonb_build_object('host', coalesce(
              substring(s.notify -> 'ntfy' ->> 'url' FROM '^[a-z]+://([^/:?#]+)'), '?')) END)
) AS c (channel, target)
WHERE c.target IS NOT NULL;

-- What owners lose: a digest of the ticks a schedule dropped in a period (overlap, misfire,
-- catch-up window, budget, ...), owed at most once per schedule, period and channel (its
-- idempotency key names the period). `details` holds what the message says, fixed when owed,
-- so a re-send says the same.
ALTER TABLE outbox ADD COLUMN details jsonb;
ALTER TABLE outbox DROP CONSTRAINT outbox_event_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_check
    CHECK (event IN ('succeeded', 'dead', 'paused', 'digest'));
