-- Where was the rollout budget wasted, iteration by iteration?
-- wasted = generated trajectories in zero-contrast groups (see the trajectories view).
WITH scoped AS (
    SELECT *
    FROM trajectories
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    any_value(strategy) AS strategy,
    iteration,
    count(*) AS trajectories,
    count(*) FILTER (WHERE wasted) AS wasted,
    round(count(*) FILTER (WHERE wasted) / count(*), 4) AS wasted_share,
    round(count(*) FILTER (WHERE effective) / count(*), 4) AS effective_ratio,
    sum(tokens) AS tokens,
    coalesce(sum(tokens) FILTER (WHERE wasted), 0) AS wasted_tokens
FROM scoped
GROUP BY run_id, iteration
ORDER BY run_id, iteration;
