-- Which task family wastes the most rollouts?
SELECT
    run_id,
    task,
    sum(trajectories)::BIGINT AS trajectories,
    sum(trajectories - effective)::BIGINT AS wasted,
    round(sum(trajectories - effective) / sum(trajectories), 4) AS wasted_share,
    round(sum(successes) / sum(trajectories), 4) AS mean_reward,
    sum(tokens - effective_tokens)::BIGINT AS wasted_tokens
FROM scoped_prompt_groups($run_id::VARCHAR)
GROUP BY run_id, task
ORDER BY run_id, wasted DESC, task;
