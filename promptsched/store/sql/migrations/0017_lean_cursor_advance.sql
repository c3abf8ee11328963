-- The cursor advance writes fewer index entries (docs/performance.md, "The rush"). Advancing a
-- cursor is an update that no HOT path can take (next_fire_at is indexed), so every index on
-- schedules gets an entry per due schedule; at a rush of 100,000 that is the scheduler's cost.
--
-- 1. schedules_due_idx holds only cursors that can come due. A one-shot that fired (every
--    follow-up's first check, every `at`) and a schedule whose cursor an edit cleared have
--    next_fire_at NULL: they no longer get an entry the scheduler never reads. Every reader
--    of the index compares next_fire_at (`<=` or min()), which implies NOT NULL, so the
--    planner still proves the predicate.
-- 2. schedules_followup_key goes: followups_owner_key (owner, key) is the same promise,
--    written in the same transaction as the schedule (ops/followups.py) and the constraint a
--    concurrent create of the same key runs into. schedules.followup_key stays as a column.
DROP INDEX schedules_due_idx;
CREATE INDEX schedules_due_idx ON schedules (next_fire_at)
    WHERE enabled AND next_fire_at IS NOT NULL;
DROP INDEX schedules_followup_key;
