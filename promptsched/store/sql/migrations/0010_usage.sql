-- Token and cost accounting (docs/providers.md): every attempt keeps the usage its provider
-- reported (with its cost when the server prices the provider), whatever its outcome; a run
-- keeps the totals over its attempts. Both columns of runs are filled by the finish that
-- already writes the row: no extra write per run.
ALTER TABLE run_attempts ADD COLUMN usage jsonb;
ALTER TABLE runs ADD COLUMN tokens bigint NOT NULL DEFAULT 0,
                 ADD COLUMN cost double precision NOT NULL DEFAULT 0;
