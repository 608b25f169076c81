-- How good was the predictor each iteration, measured prospectively? Brier score over the
-- individual 0/1 outcomes behind each prediction: (v - p)^2 + p(1 - p) for outcome rate p.
SELECT
    run_id,
    iteration,
    kind,
    count(*) AS predictions,
    round(sum(weight * ((v_pred - outcome) ^ 2 + outcome * (1 - outcome))) / sum(weight), 4) AS brier,
    round(avg(v_pred), 4) AS mean_pred,
    round(sum(outcome * weight) / sum(weight), 4) AS mean_outcome
FROM scored_predictions($run_id::VARCHAR)
GROUP BY run_id, iteration, kind
ORDER BY run_id, iteration, kind;
