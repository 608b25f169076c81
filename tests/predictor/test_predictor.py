"""The default predictor end to end: shapes, first-iteration prior, NaN rejection, root labels,
prefix siblings, calibration maps, registry, head training schedule."""

import numpy as np
import polars as pl
import pytest

from trace_core.nodes import nodes_frame
from trace_core.predictor import PredictorConfig, known_predictors, make_predictor, register_predictor
from trace_core.predictor.base import decision_labels
from trace_core.predictor.calibration import fit_isotonic, fit_platt, logit, map_from_state, sigmoid
from trace_core.predictor.evaluation import ece
from trace_core.predictor.features import featurize
from trace_core.predictor.model import SuccessHead, head_logits, schedule
from trace_core.predictor.persist import load_predictor
from trace_core.predictor.prior import outcome_counts
from trace_core.predictor.synthetic import synthetic_run


def test_fit_predict_shapes_and_range(small_run, fast_config):
    pred = make_predictor(fast_config)
    train = small_run.filter(pl.col("iteration") < 2)
    report = pred.fit(train)
    assert not report.fallback and report.n_train > 0 and report.iterations == [0, 1]
    assert report.steps >= fast_config.model.min_steps and 0 < report.batch_size <= fast_config.model.batch_size
    assert set(report.model_dump()) >= {"n_labelled", "seconds", "calib", "prior", "flip"}
    test = small_run.filter(pl.col("iteration") == 2)
    p = pred.predict(test)
    assert p.shape == (test.height,) and p.dtype == np.float64
    assert np.all((p >= 0) & (p <= 1)) and np.unique(p).size > 10
    base = pred.predict_baselines(test)
    assert set(base) == {"constant", "history", "prior"} and all(v.shape == p.shape for v in base.values())
    again = pred.fit(small_run)  # refresh: warm start, the new iteration recorded prospectively
    assert again.warm_start and again.n_calib > 0


def test_first_iteration_prior_never_crashes(small_run, fast_config):
    cfg = fast_config.model_copy(update={"first_iteration_prior": 0.3})
    pred = make_predictor(cfg)
    assert np.all(pred.predict(small_run) == 0.3)  # before any fit
    unlabelled = small_run.with_columns(pl.lit(None, dtype=pl.Float32).alias("subtree_mean_reward"),
                                        pl.lit(None, dtype=pl.Float32).alias("reward"))  # fmt: skip
    report = pred.fit(unlabelled)
    assert report.fallback and report.n_labelled == 0
    assert np.all(pred.predict(small_run) == 0.3)
    assert make_predictor(cfg).predict(nodes_frame([])).shape == (0,)
    assert make_predictor(cfg).predict_flip(nodes_frame([]).with_columns(pl.lit(0.0).alias("r"))).shape == (0,)


def test_nan_feature_rejected_naming_column(small_run, fast_config):
    bad = small_run.with_columns(pl.when(pl.col("depth") == 1).then(float("nan")).otherwise(pl.col("min_logprob"))
                                 .alias("min_logprob"))  # fmt: skip
    pred = make_predictor(fast_config)
    with pytest.raises(ValueError, match="min_logprob"):
        pred.fit(bad)
    with pytest.raises(ValueError, match="min_logprob"):
        pred.predict(bad)


def test_root_label_is_the_raw_success_rate(small_run):
    """A root's outcome is its raw rollouts' success rate; continuations below it do not count."""
    it0 = small_run.filter(pl.col("iteration") == 0)
    roots = it0.filter(pl.col("depth") == 0)
    y, w = decision_labels(roots, outcome_counts(it0))
    raw = (it0.filter(pl.col("is_leaf") & (pl.col("origin") == "raw")).group_by("prompt_id")
           .agg(pl.col("reward").mean().alias("rate"), pl.len().alias("n")))  # fmt: skip
    want = roots.select("prompt_id").join(raw, on="prompt_id", how="left")
    np.testing.assert_allclose(y, want["rate"].to_numpy())
    np.testing.assert_allclose(w, want["n"].to_numpy())
    assert (roots["subtree_count"].to_numpy() > w).any()  # the subtree label would have mixed continuations in


def test_prefix_prediction_uses_finished_siblings_not_its_own_outcome(fast_config):
    """Two prompts, same cell: at prefix scoring the siblings of a prompt that succeeded raise its
    prefixes' prediction; a prefix's own trajectory's reward never moves it."""
    from trace_core.predictor.synthetic import cell_rate_iteration

    pred = make_predictor(fast_config)
    pred.fit(cell_rate_iteration({("qa", 1): 0.5}, 0, seed=0, n_prompts=16, m=4))
    frame = cell_rate_iteration({("qa", 1): 0.5}, 1, seed=3, n_prompts=2, m=4, prompt_offset=100)
    leaf = pl.col("is_leaf") & (pl.col("origin") == "raw")
    good = frame.with_columns(pl.when(leaf).then(1.0).otherwise(pl.col("reward")).alias("reward"))
    bad = frame.with_columns(pl.when(leaf).then(0.0).otherwise(pl.col("reward")).alias("reward"))
    prefix = (frame["depth"] == 1).to_numpy()
    assert np.all(pred.predict(good)[prefix] > pred.predict(bad)[prefix] + 0.2)
    # flip only this prefix's own trajectory: its prediction stays where it was
    traj = frame.filter(pl.Series(prefix))["trajectory_id"][0]
    own = good.with_columns(pl.when(leaf & (pl.col("trajectory_id") == traj)).then(0.0).otherwise(pl.col("reward"))
                            .alias("reward"))  # fmt: skip
    row = int(np.flatnonzero(prefix & (frame["trajectory_id"] == traj).fill_null(False).to_numpy())[0])
    assert pred.predict(own)[row] == pytest.approx(pred.predict(good)[row])
    roots = (frame["depth"] == 0).to_numpy()
    np.testing.assert_allclose(pred.predict(good)[roots], pred.predict(bad)[roots])  # roots: before any rollout


@pytest.mark.parametrize("fitter", [fit_platt, fit_isotonic])
def test_calibration_improves_ece_on_miscalibrated_set(fitter):
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.05, 0.95, 4000)
    y = (rng.random(4000) < truth).astype(float)
    raw = sigmoid(2.5 * logit(truth) + 0.8)  # overconfident and biased upward
    w = np.ones_like(raw)
    cal = fitter(raw[:2000], y[:2000], w[:2000])
    before, after = ece(raw[2000:], y[2000:]), ece(cal(raw[2000:]), y[2000:])
    assert before > 0.1 and after < 0.04 and after < before / 3
    again = map_from_state(cal.to_state())  # plain JSON state, same map
    np.testing.assert_allclose(again(raw[:50]), cal(raw[:50]))


def test_calibration_of_one_class_is_identity():
    p = np.array([0.2, 0.7])
    assert np.allclose(fit_platt(p, np.ones(2), np.ones(2))(p), p)


def test_schedule_sizes_the_batch_to_the_data():
    cfg = PredictorConfig().model
    batch, steps = schedule(600, cfg, warm=False)
    assert cfg.min_batch_size <= batch < 600 and steps >= cfg.min_steps  # many steps, not one per epoch
    assert schedule(600, cfg, warm=True)[1] >= cfg.warm_steps
    big_batch, big_steps = schedule(200_000, cfg, warm=False)
    assert big_batch == cfg.batch_size and big_steps == cfg.max_steps


def test_untrained_head_predicts_the_prior(small_run):
    cfg = PredictorConfig().features
    fb = featurize(small_run.head(50), cfg)
    head = SuccessHead(1 << cfg.hash_bits, fb.dense.shape[1], hidden=16)
    offset = np.linspace(-2, 2, 50)
    np.testing.assert_allclose(head_logits(head, fb, offset), offset, atol=1e-5)


def test_registry_rejects_duplicates_and_lists_known():
    assert {"hashed_mlp", "hashed_logistic", "hf_encoder"} <= set(known_predictors())
    with pytest.raises(ValueError, match="already registered"):
        register_predictor("hashed_mlp")(lambda cfg: None)
    with pytest.raises(ValueError, match="hashed_mlp"):
        make_predictor(PredictorConfig(name="nope"))


def test_logistic_variant(small_run, fast_config):
    pred = make_predictor(fast_config.model_copy(update={"name": "hashed_logistic"}))
    assert pred.config.model.hidden == 0
    pred.fit(small_run)
    assert pred.head is not None and pred.head.shape[2] == 0


def test_concentration_is_the_prior_strength_plus_the_prompts_own_record(small_run, fast_config):
    pred = make_predictor(fast_config)
    roots = small_run.filter((pl.col("iteration") == 2) & (pl.col("depth") == 0))
    assert pred.predict_concentration(roots) is None  # nothing fitted: no posterior to speak of
    pred.fit(small_run.filter(pl.col("iteration") < 2))
    c = pred.predict_concentration(roots)
    counts = outcome_counts(small_run.filter(pl.col("iteration") < 2))
    seen = set(counts["prompt_id"].to_list())
    was_seen = np.array([p in seen for p in roots["prompt_id"].to_list()])
    kp = pred.prior.kappa_prompt
    assert c.shape == (roots.height,) and np.all(c >= kp - 1e-9)
    assert np.allclose(c[~was_seen], kp) and np.all(c[was_seen] > kp)  # an unseen prompt has the prior alone
    # the discounted record: the latest iteration counts fully, the one before it at the discount
    g = pred.prior.discount
    by_prompt = counts.group_by("prompt_id").agg(
        (pl.col("n") * pl.lit(g) ** (1 - pl.col("iteration"))).sum().alias("w"))
    w = dict(zip(by_prompt["prompt_id"].to_list(), by_prompt["w"].to_list(), strict=True))
    expect = np.array([kp + w.get(p, 0.0) for p in roots["prompt_id"].to_list()])
    assert np.allclose(c, expect)


def _with_ref_scores(nodes: pl.DataFrame, seed: int = 0) -> pl.DataFrame:
    """Roots get ``ref_score``: the within-(iteration, cell) rank of a noisy reading of their true
    success probability, scaled to [-0.5, 0.5] (what stage 2 records from the demonstration)."""
    rng = np.random.default_rng(seed)
    noisy = nodes["true_p"].to_numpy() + rng.normal(0, 0.05, nodes.height)
    cell = ["iteration", "task", "difficulty"]
    ranked = (nodes.with_columns(pl.Series("_r", noisy))
              .with_columns(pl.when(pl.col("depth") == 0).then(pl.col("_r")).alias("_r"))
              .with_columns(((pl.col("_r").rank("average").over(cell) - 1)
                             / (pl.col("_r").count().over(cell) - 1).clip(1, None) - 0.5).alias("ref_score")))
    return ranked.drop("_r")


def test_the_reference_term_orders_unseen_roots_by_their_score(fast_config, tmp_path):
    """predictor.reference: roots of prompts never sampled, which the prior cannot tell apart within
    a cell, are ordered by their reference score once the term is fitted; it survives a save."""
    from scipy.stats import spearmanr

    run = _with_ref_scores(synthetic_run(4, seed=3, n_prompts=600, prompts_per_iter=60))
    history, nxt = run.filter(pl.col("iteration") < 3), run.filter((pl.col("iteration") == 3) & (pl.col("depth") == 0))
    seen = set(outcome_counts(history)["prompt_id"].to_list())
    unseen = nxt.filter(~pl.col("prompt_id").is_in(list(seen)))
    assert unseen.height >= 30
    cfg = fast_config.model_copy(update={"reference": fast_config.reference.model_copy(
        update={"enabled": True, "min_nodes": 20})})
    on, off = make_predictor(cfg), make_predictor(fast_config)
    report = on.fit(history)
    off.fit(history)
    assert any(k.startswith("reference_") and "b" in v for k, v in report.calib.items())
    assert all(b > 0 for _, b in on.reference.coefs.values()), "a higher rank means more success"

    def within_cells(pred) -> float:  # mean Spearman correlation with true_p inside each (family, difficulty)
        frame = unseen.with_columns(pl.Series("p", pred.predict(unseen)))
        rhos = [spearmanr(c["p"], c["true_p"]).statistic for _, c in frame.group_by("task", "difficulty")
                if c.height >= 4 and c["p"].n_unique() > 1]
        return float(np.mean(rhos)) if rhos else 0.0

    rho_on, rho_off = within_cells(on), within_cells(off)
    assert rho_on > 0.5 and rho_on > rho_off + 0.3, (rho_on, rho_off)
    assert np.allclose(on.predict(unseen.drop("ref_score")), off.predict(unseen.drop("ref_score")), atol=0.05), \
        "without a score the term is silent"
    back = load_predictor(on.save(tmp_path / "p.safetensors"))
    assert back.reference.coefs == on.reference.coefs
    assert np.allclose(back.predict(unseen), on.predict(unseen))
