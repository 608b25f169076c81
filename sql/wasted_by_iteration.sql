-- Where was the rollout budget wasted, iteration by iteration?
-- wasted = generated trajectories in zero-contrast groups (see the trajectory_groups view).
SELECT
    run_id,
    any_value(strategy) AS strategy,
    iteration,
    sum(trajectories)::BIGINT AS trajectories,
    coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted,
    round(coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0) / sum(trajectories), 4) AS wasted_share,
    round(coalesce(sum(trajectories) FILTER (WHERE contrastive), 0) / sum(trajectories), 4) AS effective_ratio,
    sum(tokens)::BIGINT AS tokens,
    coalesce(sum(tokens) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted_tokens
FROM scoped_groups($run_id::VARCHAR)
GROUP BY run_id, iteration
ORDER BY run_id, iteration;
