-- Which allocation strategy turns its budget into contrastive (learning) samples?
-- effective_per_1k_tokens: effective trajectories per 1000 generated tokens.
SELECT
    strategy,
    count(DISTINCT run_id) AS runs,
    sum(trajectories)::BIGINT AS trajectories,
    sum(effective)::BIGINT AS effective,
    round(sum(effective) / sum(trajectories), 4) AS effective_ratio,
    sum(tokens)::BIGINT AS tokens,
    round(1000 * sum(effective) / nullif(sum(tokens), 0), 4) AS effective_per_1k_tokens
FROM scoped_prompt_groups($run_id::VARCHAR)
GROUP BY strategy
ORDER BY effective_ratio DESC, strategy;
