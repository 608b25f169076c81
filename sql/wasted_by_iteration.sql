-- Where was the rollout budget wasted, iteration by iteration?
-- wasted = generated trajectories in zero-contrast groups (see the trajectory_groups view),
-- summed per prompt (prompt_groups).
SELECT
    run_id,
    any_value(strategy) AS strategy,
    iteration,
    sum(trajectories)::BIGINT AS trajectories,
    sum(trajectories - effective)::BIGINT AS wasted,
    round(sum(trajectories - effective) / sum(trajectories), 4) AS wasted_share,
    round(sum(effective) / sum(trajectories), 4) AS effective_ratio,
    sum(tokens)::BIGINT AS tokens,
    sum(tokens - effective_tokens)::BIGINT AS wasted_tokens
FROM scoped_prompt_groups($run_id::VARCHAR)
GROUP BY run_id, iteration
ORDER BY run_id, iteration;
