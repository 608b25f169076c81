-- Answer the named queries from the raw nodes instead of the stored group summaries (a check of
-- the summaries, or a home whose summaries cannot be written): trajectory_groups recomputed, and
-- prompt_groups summed from them (trace_core.home.groups.prompt_rows, the same definition).
CREATE OR REPLACE VIEW trajectory_groups AS
SELECT * FROM trajectory_groups_from_nodes;

CREATE OR REPLACE VIEW prompt_groups AS
SELECT
    run_id,
    strategy,
    iteration,
    prompt_id,
    task,
    difficulty,
    count(*) FILTER (WHERE origin = 'raw') AS raw_groups,
    count(*) AS groups,
    sum(trajectories)::BIGINT AS trajectories,
    sum(tokens)::BIGINT AS tokens,
    sum(successes) AS successes,
    sum(effective)::BIGINT AS effective,
    sum(effective_tokens)::BIGINT AS effective_tokens,
    sum(trajectories - effective)::BIGINT AS wasted
FROM trajectory_groups_from_nodes
GROUP BY run_id, strategy, iteration, prompt_id, task, difficulty;
