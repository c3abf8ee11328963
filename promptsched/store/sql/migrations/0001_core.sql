-- Core tables: schedules (with their next_fire_at cursor), runs (one per owed slot),
-- run_attempts (one per claim, keyed by the fencing token).

CREATE TABLE schedules (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner            text        NOT NULL DEFAULT 'default',
    name             text        NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('cron', 'rrule', 'at', 'every')),
    expression       text        NOT NULL,
    timezone         text        NOT NULL DEFAULT 'UTC',
    dst_gap          text        NOT NULL DEFAULT 'shift' CHECK (dst_gap IN ('shift', 'skip')),
    dst_fold         text        NOT NULL DEFAULT 'first' CHECK (dst_fold IN ('first', 'both')),
    prompt           text        NOT NULL,
    provider         text        NOT NULL DEFAULT 'echo',
    model            text,
    params           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    misfire_policy   text        NOT NULL DEFAULT 'run_once'
                                 CHECK (misfire_policy IN ('run_once', 'skip', 'run_all')),
    misfire_cap      integer     NOT NULL DEFAULT 100 CHECK (misfire_cap > 0),
    misfire_grace    interval    NOT NULL DEFAULT '60 seconds',
    catchup_window   interval,
    overlap_policy   text        NOT NULL DEFAULT 'skip'
                                 CHECK (overlap_policy IN ('skip', 'allow', 'buffer_one',
                                                           'buffer_all', 'cancel_other')),
    max_attempts     integer     NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 100),
    timeout          interval    NOT NULL DEFAULT '5 minutes',
    jitter           interval,
    enabled          boolean     NOT NULL DEFAULT true,
    paused_until     timestamptz,
    pause_reason     text,
    -- pause the schedule after this many consecutive dead runs (NULL: never)
    pause_after_failures integer CHECK (pause_after_failures > 0),
    next_fire_at     timestamptz,
    version          integer     NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The scheduler's due query walks this index in next_fire_at order.
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE enabled;
CREATE INDEX schedules_owner_idx ON schedules (owner, id);
-- Paused schedules with an auto-resume instant.
CREATE INDEX schedules_resume_idx ON schedules (paused_until) WHERE NOT enabled;

-- Who changed what, when: one row per create/update/pause/resume/delete.
CREATE TABLE schedule_changes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id bigint      NOT NULL,
    owner       text        NOT NULL,
    actor       text        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('create', 'update', 'pause', 'resume',
                                                        'delete', 'trigger', 'backfill',
                                                        'auto_pause', 'auto_resume')),
    changes     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedule_changes_schedule_idx ON schedule_changes (schedule_id, id);

CREATE TABLE runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule_id      bigint      NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    slot             timestamptz NOT NULL,
    origin           text        NOT NULL DEFAULT 'cadence'
                                 CHECK (origin IN ('cadence', 'manual', 'backfill', 'replay')),
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'running', 'succeeded', 'dead',
                                                   'cancelled', 'skipped')),
    skip_reason      text,
    missed_slots     integer     NOT NULL DEFAULT 0,
    -- serial runs (overlap buffer_one/buffer_all) start only after every earlier run finished
    serial           boolean     NOT NULL DEFAULT false,
    provider         text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    releases         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    available_at     timestamptz NOT NULL DEFAULT now(),
    attempt_id       uuid,
    worker_id        text,
    lease_expires_at timestamptz,
    deadline_at      timestamptz,
    cancel_requested boolean     NOT NULL DEFAULT false,
    output           text,
    usage            jsonb,
    error            text,
    replay_of        bigint      REFERENCES runs (id) ON DELETE SET NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CONSTRAINT runs_skipped_has_reason CHECK (status <> 'skipped' OR skip_reason IS NOT NULL),
    CONSTRAINT runs_running_has_lease CHECK (
        status <> 'running' OR (attempt_id IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- Invariant 1: a cadence slot produces at most one run row. Manual, backfill and replay runs
-- are marked by origin and never collide with it.
CREATE UNIQUE INDEX runs_cadence_slot_key ON runs (schedule_id, slot) WHERE origin = 'cadence';
CREATE UNIQUE INDEX runs_backfill_slot_key ON runs (schedule_id, slot) WHERE origin = 'backfill';
-- Claim walks this partial index in (available_at, id) order, so a backlog is never sorted.
CREATE INDEX runs_claim_idx ON runs (provider, available_at, id) WHERE status = 'pending';
-- The reaper walks expired leases.
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_schedule_idx ON runs (schedule_id, slot DESC);
CREATE INDEX runs_unfinished_idx ON runs (schedule_id, slot) WHERE status IN ('pending', 'running');
CREATE INDEX runs_finished_idx ON runs (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE run_attempts (
    attempt_id       uuid        PRIMARY KEY,
    run_id           bigint      NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    number           integer     NOT NULL,
    worker_id        text        NOT NULL,
    status           text        NOT NULL DEFAULT 'running'
                                 CHECK (status IN ('running', 'succeeded', 'failed', 'lost',
                                                   'released', 'cancelled', 'skipped')),
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    error            text,
    UNIQUE (run_id, number)
);
