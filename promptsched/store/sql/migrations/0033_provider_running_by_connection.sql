-- provider_running's shards chosen by the connection that writes, not by the worker whose run
-- it is (0027_provider_running.sql, 0029_provider_running_no_join.sql). A process's final writes
-- go out on two connections at once (roles/worker/finalizer.py), and both counted their runs'
-- ends on their worker's one shard: the second write waited on that counter row until the
-- first had committed, so the two commits never shared a flush. A connection's writes are one
-- at a time, so no two of them wait on each other's row; two connections share one only when
-- their backends' pids are alike modulo 16.
CREATE OR REPLACE FUNCTION runs_count_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Per provider, the rows running after the statement less those running before it: a
    -- renewal nets to nothing and writes nothing. Two aggregates, no join of the transition
    -- tables (0029). One counter row per provider side, in key order.
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    SELECT t.provider, pg_backend_pid() % 16,
           CASE WHEN sum(t.runs) > 0 THEN 'started' ELSE 'ended' END, abs(sum(t.runs))
    FROM (
        SELECT n.provider, 1 AS runs FROM new_runs n WHERE n.status = 'running'
        UNION ALL
        SELECT o.provider, -1 FROM old_runs o WHERE o.status = 'running'
    ) AS t
    GROUP BY t.provider
    HAVING sum(t.runs) <> 0
    ORDER BY t.provider
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION runs_count_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO provider_running AS c (provider, shard, side, runs)
    VALUES (CASE WHEN TG_OP = 'INSERT' THEN NEW.provider ELSE OLD.provider END,
            pg_backend_pid() % 16,
            CASE WHEN TG_OP = 'INSERT' THEN 'started' ELSE 'ended' END, 1)
    ON CONFLICT (provider, side, shard) DO UPDATE SET runs = c.runs + excluded.runs;
    RETURN NULL;
END
$$;

DROP FUNCTION provider_running_add(text, text, text, bigint);
