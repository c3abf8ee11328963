-- Agent runs: each attempt keeps its transcript (model replies, tool calls with arguments,
-- tool results truncated, timings, tokens), appended step by step while it runs, so an
-- attempt lost to a crash keeps what it did. A constant default: no table rewrite.

ALTER TABLE run_attempts ADD COLUMN transcript jsonb NOT NULL DEFAULT '[]'::jsonb;
