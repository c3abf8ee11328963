-- The outbox: one "notification owed" row per channel, written in the same statement that
-- finishes a run (succeeded or dead), drained by the notifier. Plus each schedule's targets.

ALTER TABLE schedules
    ADD COLUMN notify jsonb NOT NULL DEFAULT '{}'::jsonb
        CONSTRAINT schedules_notify_is_object CHECK (jsonb_typeof(notify) = 'object');

-- One row per channel a schedule notifies, with the target as the outbox stores it (never the
-- webhook secret: the notifier reads it from the schedule when it signs). Written defensively,
-- since a malformed value must never make a run's finish fail: anything but a boolean flag
-- counts as true, anything but a non-empty array/object is no target.
CREATE VIEW notify_channels AS
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
          THEN (s.notify -> 'webhook') - 'secret' END)
) AS c (channel, target)
WHERE c.target IS NOT NULL;

CREATE TABLE outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id           bigint      NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    schedule_id      bigint      NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    channel          text        NOT NULL CHECK (channel IN ('email', 'webhook')),
    target           jsonb       NOT NULL,
    event            text        NOT NULL CHECK (event IN ('succeeded', 'dead', 'paused')),
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'sending', 'sent', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    -- NULL until the first claim stamps the notifier's configured maximum
    max_attempts     integer     CHECK (max_attempts > 0),
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    -- minted at each claim; marking the row is conditioned on it (a fencing token)
    claim_token      uuid,
    last_error       text,
    -- the same on every re-send: the Message-ID / Idempotency-Key receivers deduplicate on
    idempotency_key  text        NOT NULL UNIQUE,
    created_at       timestamptz NOT NULL DEFAULT now(),
    sent_at          timestamptz,
    CONSTRAINT outbox_sending_has_lease CHECK (
        status <> 'sending' OR (claim_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- Claim walks this partial index in (available_at, id) order.
CREATE INDEX outbox_claim_idx ON outbox (available_at, id) WHERE status = 'pending';
-- Expired claims (a notifier died mid-send) are found through this one.
CREATE INDEX outbox_lease_idx ON outbox (lease_expires_at) WHERE status = 'sending';
CREATE INDEX outbox_dead_idx ON outbox (id) WHERE status = 'dead';
CREATE INDEX outbox_run_idx ON outbox (run_id);
CREATE INDEX outbox_schedule_idx ON outbox (schedule_id);
