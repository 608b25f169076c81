-- How does waste depend on prompt difficulty (the generator's difficulty level)?
SELECT
    run_id,
    task,
    difficulty,
    sum(trajectories)::BIGINT AS trajectories,
    sum(trajectories - effective)::BIGINT AS wasted,
    round(sum(trajectories - effective) / sum(trajectories), 4) AS wasted_share,
    round(sum(successes) / sum(trajectories), 4) AS mean_reward
FROM scoped_prompt_groups($run_id::VARCHAR)
GROUP BY run_id, task, difficulty
ORDER BY run_id, task, difficulty;
