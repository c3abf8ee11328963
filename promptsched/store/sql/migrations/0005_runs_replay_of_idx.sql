-- Deleting a run (retention, a deleted schedule) makes Postgres clear `replay_of` in the runs
-- that replayed it (ON DELETE SET NULL). runs_replay_key is partial on origin, so that lookup
-- had no usable index and read the whole runs table once per deleted run. Only replays carry
-- `replay_of`: the index stays as small as they are.

CREATE INDEX runs_replay_of_idx ON runs (replay_of) WHERE replay_of IS NOT NULL;
