-- Monitors (docs/monitors.md): a schedule may declare the JSON Schema its answers follow and
-- when a success notifies; a run keeps its answer's parsed JSON and the notification decision
-- its finish made ({"notify": bool, "reason": text, "since": run id}; NULL when the schedule
-- notifies on every success, as before).
ALTER TABLE schedules ADD COLUMN output_schema jsonb;
ALTER TABLE schedules ADD COLUMN notify_when text NOT NULL DEFAULT 'always';
ALTER TABLE schedules ADD CONSTRAINT schedules_output_schema_is_object
    CHECK (output_schema IS NULL OR jsonb_typeof(output_schema) = 'object');
ALTER TABLE runs ADD COLUMN output_json jsonb;
ALTER TABLE runs ADD COLUMN notify_decision jsonb;
