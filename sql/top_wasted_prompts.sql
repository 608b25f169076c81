-- Which prompts soaked up the most wasted trajectories (all iterations together)? Top 20.
-- iterations: the iterations that sampled the prompt (each holds one raw group of it).
WITH top AS (
    -- two passes over the prompt summaries (one row per prompt and iteration, its groups summed):
    -- the waste of every prompt first, from the rows that hold some (one sum per prompt: the only
    -- aggregation that sees every distinct prompt, millions in a long run over a fresh prompt
    -- stream), then the other columns of the top 20 alone
    SELECT run_id, prompt_id
    FROM scoped_prompt_groups($run_id::VARCHAR)
    WHERE wasted > 0
    GROUP BY run_id, prompt_id
    ORDER BY sum(wasted) DESC, run_id, prompt_id
    LIMIT 20
)

SELECT
    p.run_id,
    p.prompt_id,
    any_value(p.task) AS task,
    any_value(p.difficulty) AS difficulty,
    sum(p.raw_groups)::BIGINT AS iterations,
    sum(p.trajectories)::BIGINT AS trajectories,
    sum(p.wasted)::BIGINT AS wasted,
    round(sum(p.successes) / sum(p.trajectories), 4) AS mean_reward
FROM scoped_prompt_groups($run_id::VARCHAR) AS p
SEMI JOIN top AS t ON t.run_id = p.run_id AND t.prompt_id = p.prompt_id
GROUP BY p.run_id, p.prompt_id
ORDER BY wasted DESC, p.run_id, p.prompt_id;
