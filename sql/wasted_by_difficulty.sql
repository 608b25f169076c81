-- How does waste depend on prompt difficulty (the generator's difficulty level)?
WITH scoped AS (
    SELECT *
    FROM trajectory_groups
    WHERE $run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR
)

SELECT
    run_id,
    task,
    difficulty,
    sum(trajectories)::BIGINT AS trajectories,
    coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0)::BIGINT AS wasted,
    round(coalesce(sum(trajectories) FILTER (WHERE NOT contrastive), 0) / sum(trajectories), 4) AS wasted_share,
    round(sum(successes) / sum(trajectories), 4) AS mean_reward
FROM scoped
GROUP BY run_id, task, difficulty
ORDER BY run_id, task, difficulty;
