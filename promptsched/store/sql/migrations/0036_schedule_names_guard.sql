-- A schedule's name is unique per owner in the database itself, whatever release writes it.
-- schedule_names (0032) holds the promise for the releases that claim a name there; this
-- trigger holds it also against one that does not (a release before 0032, running beside a
-- newer one during a roll), so that no release can make a second `echo-1`.
--
-- A trigger and not a unique index on schedules: every cursor advance of the scheduler writes
-- an entry in each index of schedules (0017), while this fires only when a schedule is created
-- or its name or owner set. It is deferred to the commit, so a release that claims the name in
-- its own transaction (0032) still answers a taken name with its own words, and registers the
-- name there (as schedule_name_claim does) for a release that did not.
--
-- Names two schedules of one owner share already (made by such a release): the oldest (lowest
-- id) keeps it, each later one is renamed "<name> #<id>" and its history says so (an update by
-- promptsched), as 0032 did; every schedule's name is registered in schedule_names. The
-- trigger comes first, so no write of another release slips in between.

CREATE FUNCTION schedule_name_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    cur record;
    holder bigint;
BEGIN
    -- The row as it is now: a later statement of the transaction may have renamed it again.
    SELECT s.owner, s.name, s.followup_key INTO cur FROM schedules s WHERE s.id = NEW.id;
    IF NOT FOUND OR cur.followup_key IS NOT NULL THEN
        RETURN NULL;
    END IF;
    WITH released AS (
        DELETE FROM schedule_names
        WHERE schedule_id = NEW.id AND (owner, name) IS DISTINCT FROM (cur.owner, cur.name)
    )
    INSERT INTO schedule_names (owner, name, schedule_id)
    VALUES (cur.owner, cur.name, NEW.id)
    ON CONFLICT (owner, name) DO UPDATE SET schedule_id = schedule_names.schedule_id
    RETURNING schedule_id INTO holder;
    IF holder <> NEW.id THEN
        RAISE EXCEPTION 'schedule % is already named % (names are unique per owner)',
            holder, quote_literal(cur.name)
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'schedule_names_pkey';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER schedules_name_unique
    AFTER INSERT OR UPDATE OF owner, name, followup_key ON schedules
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.followup_key IS NULL)
    EXECUTE FUNCTION schedule_name_guard();

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

DELETE FROM schedule_names n USING schedules s
WHERE s.id = n.schedule_id AND (s.owner, s.name) IS DISTINCT FROM (n.owner, n.name);

INSERT INTO schedule_names (owner, name, schedule_id)
SELECT owner, name, id FROM schedules WHERE followup_key IS NULL
ON CONFLICT DO NOTHING;
