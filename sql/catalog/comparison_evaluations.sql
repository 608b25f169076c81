-- The evaluations of a comparison's children (or of one run): what the comparison page's
-- learning curves are drawn from (held-out accuracy after `iteration` iterations, 0 = warm start).
SELECT run_id, strategy, iteration, split, family, accuracy, episodes
FROM evaluations
WHERE run_id IN (SELECT run_id FROM run_scope($run_id::VARCHAR))
ORDER BY run_id, iteration, split, family;
