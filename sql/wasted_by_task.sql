-- Which task family wastes the most rollouts?
SELECT
    run_id,
    task,
    sum(trajectories)::BIGINT AS trajectories,
    coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted,
    round(coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0) / sum(trajectories), 4) AS wasted_share,
    round(sum(successes) / sum(trajectories), 4) AS mean_reward,
    coalesce(sum(tokens) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted_tokens
FROM scoped_groups($run_id::VARCHAR)
GROUP BY run_id, task
ORDER BY run_id, wasted DESC, task;
