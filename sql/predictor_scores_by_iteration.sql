-- How good was the predictor each iteration, measured prospectively? Brier score over the
-- individual 0/1 outcomes behind each prediction: (v - p)^2 + p(1 - p) for outcome rate p.
WITH scoped AS (
    SELECT run_id, iteration, kind, v_pred, outcome, coalesce(weight, 1.0) AS weight
    FROM predictions
    WHERE ($run_id::VARCHAR IS NULL OR run_id = $run_id::VARCHAR)
        AND v_pred IS NOT NULL AND outcome IS NOT NULL
)

SELECT
    run_id,
    iteration,
    kind,
    count(*) AS predictions,
    round(sum(weight * ((v_pred - outcome) ^ 2 + outcome * (1 - outcome))) / sum(weight), 4) AS brier,
    round(avg(v_pred), 4) AS mean_pred,
    round(sum(outcome * weight) / sum(weight), 4) AS mean_outcome
FROM scoped
GROUP BY run_id, iteration, kind
ORDER BY run_id, iteration, kind;
