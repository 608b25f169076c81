-- At which branching depth is budget wasted? anchor_depth 0 = raw rollouts from the prompt,
-- t > 0 = continuations from the prefix after turn t.
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    anchor_depth,
    count(*) AS trajectories,
    count(*) FILTER (WHERE wasted) AS wasted,
    round(count(*) FILTER (WHERE wasted) / count(*), 4) AS wasted_share,
    coalesce(sum(tokens) FILTER (WHERE wasted), 0) AS wasted_tokens
FROM scoped
GROUP BY run_id, anchor_depth
ORDER BY run_id, anchor_depth;
