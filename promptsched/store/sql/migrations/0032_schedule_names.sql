-- A schedule's name is unique per owner, so the CLI takes a name wherever it takes an id
-- (`promptsched schedules trigger weekly`). A follow-up is named by its key (followups_owner_key)
-- and is not registered here: many follow-ups may share a display name.
--
-- The promise lives in its own small table, not in an index on schedules: every cursor advance
-- of the scheduler writes an entry in each index of schedules (0017), while a name changes only
-- when a person creates or renames a schedule. Deleting a schedule frees its name.
--
-- Schedules that already shared a name with another of their owner's: the oldest (lowest id)
-- keeps it, each later one is renamed "<name> #<id>", and its history says so (an update by
-- promptsched). Nothing else about them changes.
-- One row per schedule: schedule_name_claim releases the old name in the statement that
-- claims the new one (a unique index on schedule_id would see both in that statement).
CREATE TABLE schedule_names (
    owner       text   NOT NULL,
    name        text   NOT NULL,
    schedule_id bigint NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    PRIMARY KEY (owner, name)
);
CREATE INDEX schedule_names_schedule_idx ON schedule_names (schedule_id);

WITH ranked AS (
    SELECT id, name,
           row_number() OVER (PARTITION BY owner, name ORDER BY id) AS rank
    FROM schedules
    WHERE followup_key IS NULL
), renamed AS (
    UPDATE schedules s
    SET name = left(r.name, 180) || ' #' || s.id, version = s.version + 1, updated_at = now()
    FROM ranked r
    WHERE r.id = s.id AND r.rank > 1
    RETURNING s.id, s.owner, r.name AS before, s.name AS after
)
INSERT INTO schedule_changes (schedule_id, owner, actor, action, changes)
SELECT id, owner, 'promptsched', 'update', jsonb_build_object('name', jsonb_build_array(before, after))
FROM renamed;

INSERT INTO schedule_names (owner, name, schedule_id)
SELECT owner, name, id FROM schedules WHERE followup_key IS NULL;
