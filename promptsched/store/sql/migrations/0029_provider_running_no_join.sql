-- runs_count_changed (0027_provider_running.sql) without a join of the transition tables:
-- Postgres knows nothing of their sizes and planned the join as a nested loop, so a statement
-- that changed 2,000 rows (a heartbeat, a large finish) spent 590 ms in its trigger (seen in
-- W9 at 2,000 runs in flight). Per provider and shard it now adds the rows running after the
-- statement less those running before it, two aggregates.
CREATE OR REPLACE FUNCTION runs_count_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Per provider and shard, the rows running after the statement less those running
    -- before it: a renewal nets to nothing and writes nothing. Two aggregates, no join of the
    -- transition tables: Postgres knows nothing of their sizes, and a join of them was
    -- planned as a nested loop (2,000 rows each: 590 ms). Counter rows are written in key
    -- order, so that two statements never wait on each other's rows crosswise.
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    SELECT t.provider, t.shard, CASE WHEN sum(t.runs) > 0 THEN 'started' ELSE 'ended' END,
           abs(sum(t.runs))
    FROM (
        SELECT n.provider, hashtext(coalesce(n.worker_id, '')) & 15 AS shard, 1 AS runs
        FROM new_runs n WHERE n.status = 'running'
        UNION ALL
        SELECT o.provider, hashtext(coalesce(o.worker_id, '')) & 15, -1
        FROM old_runs o WHERE o.status = 'running'
    ) AS t
    GROUP BY t.provider, t.shard
    HAVING sum(t.runs) <> 0
    ORDER BY t.provider, 3, t.shard
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;
