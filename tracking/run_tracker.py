"""MLflow tracking of one training flow run (buffered: an outage never stops training)."""

from __future__ import annotations

from pathlib import Path

from trace_core.analysis.rollout_stats import rollout_metrics
from trace_core.config import TrainConfig
from trace_core.home.shards import read_shard
from trace_core.policy.config import checkpoint_sizes
from trace_core.stages.results import Evaluation, IterationResults, IterationTiming
from trace_core.stages.run import RunRef, initial_checkpoint
from tracking.journal import read_int
from tracking.links import git_state, mlflow_run_url
from tracking.mlflow_tracker import Tracker
from tracking.registry import dataset_records, model_files
from tracking.report import publish_run_artifacts


def _predictor_key(name: str) -> str:
    """``root_model_auc`` -> ``predictor/root_auc``; a baseline keeps its name
    (``root_history_auc`` -> ``predictor/root_history_auc``)."""
    return "predictor/" + name.replace("_model_", "_", 1)


def accuracy_metrics(columns: dict) -> dict[str, float]:
    """``accuracy`` / ``accuracy_<family>`` columns -> ``accuracy/all`` / ``accuracy/<family>``."""
    return {("accuracy/all" if k == "accuracy" else "accuracy/" + k.removeprefix("accuracy_")): v
            for k, v in columns.items() if k.startswith("accuracy") and v is not None}


def evaluation_metrics(accuracy: Evaluation) -> dict[str, float]:
    """A held-out evaluation: accuracy overall and per family (and the training probe's). Logged
    at the step of the ``evaluations`` view: the number of iterations the policy has been trained
    (0 = before training), i.e. the step of the iteration whose rollouts that policy generates.
    Its wall seconds are the iteration's (``wall_metrics``)."""
    probe = {} if accuracy.probe_accuracy is None else {"accuracy/probe": accuracy.probe_accuracy}
    return accuracy_metrics(accuracy.columns()) | probe


def wall_metrics(timing: IterationTiming) -> dict[str, float]:
    """This process's wall times of an iteration (``flows.ending.overhead_split``): the whole
    iteration, orchestration + tracking overhead, evaluation. The per-stage wall times equal the
    stages' own ``time/<stage>_s`` and are not logged twice."""
    return {"time/iteration_s": timing.iteration_s, "time/overhead_s": timing.overhead_s,
            "time/overhead_share": timing.overhead_share, "time/evaluate_s": timing.evaluate_s}


def iteration_metrics(results: IterationResults, row: dict) -> dict[str, float]:
    """The per-iteration metrics, grouped by ``/`` in the MLflow UI: ``effective/`` (ratio, waste),
    ``reward/``, ``budget/`` (trajectories asked / used, tokens, branching), ``accuracy/``,
    ``predictor/`` (fit, prospective Brier / AUC / ECE), ``update/`` and ``time/`` (stage seconds).
    Accuracy is not among them: it is logged per evaluation (``evaluation_metrics``)."""
    ver, fit = results.verified, results.predictor.fit
    out = {"effective/ratio": ver.effective_ratio, "effective/wasted_share": ver.wasted_share,
           "effective/wasted": ver.wasted, "effective/per_1k_tokens": ver.effective_per_1k_tokens,
           "effective/confident_confirmed_share": ver.confirmed_confident_share,
           "reward/train": ver.train_reward, "reward/mismatches": ver.reward_mismatches,
           "budget/asked": row["budget_asked"], "budget/used": row["budget_used"], "budget/tokens": row["tokens"],
           "budget/prefixes_branched": results.prefixes.branched,
           "budget/expected_contrastive": results.roots.expected_contrastive,
           "time/raw_tokens_per_s": results.raw.tokens_per_s,
           "predictor/train_loss": fit.train_loss, "predictor/labelled": fit.n_labelled}
    out.update({f"update/{k}": v for k, v in results.update.stats.metrics().items()})
    out.update({f"time/{k}_s": v for k, v in results.stage_seconds().items()})
    out.update({_predictor_key(k): v for k, v in ver.predictor_metrics.items()})
    return out


def trained_params(cfg: TrainConfig) -> dict:
    """The config as MLflow params, its ``model`` section describing the model actually trained:
    the directory it loads from and the sizes that checkpoint's ``config.json`` states (the size
    fields only shape a model built from scratch by ``trace-rl warmup``)."""
    params = cfg.model_dump(mode="json")
    path = initial_checkpoint(cfg)
    params["model"] = {**params["model"], **checkpoint_sizes(path), "path": path}
    return params


class RunTracker:
    """One MLflow run per training run (a child of ``parent`` for ``compare``). Steps are the
    iteration numbers, so a resumed run continues its curves without gaps or repeats."""

    def __init__(self, ref: RunRef, cfg: TrainConfig, *, tracking_uri: str | None = None, parent: str | None = None,
                 tags: dict[str, str] | None = None):
        tcfg = cfg.tracking.model_copy(update={"tracking_uri": tracking_uri or cfg.tracking.tracking_uri})
        # a handle on the comparison's parent run, which the comparison's own tracker writes
        self.parent = Tracker(ref.home, parent, config=tcfg, journal=False) if parent else None
        self.cfg = cfg
        self.tracker = Tracker(ref.home, ref.run_id, config=tcfg, parent=self.parent,
                               tags={"trace_rl.strategy": cfg.allocation.strategy})
        # set on every session (a resume may run other code, from another Prefect flow run)
        self.tracker.set_tags({**git_state(), **(tags or {})})
        self.tracker.log_params(trained_params(cfg))
        if cfg.data.enabled:  # the data files, with their digests
            self.tracker.log_inputs(dataset_records(cfg))

    def mlflow_link(self) -> dict[str, str | None]:
        """The MLflow run of this training run (id, experiment, tracking URI, UI URL when the
        backend is a server); ids are None until the tracker has reached MLflow."""
        t = self.tracker
        return {"run_id": t.mlflow_run_id, "experiment_id": t.experiment_id, "tracking_uri": t.tracking_uri,
                "url": mlflow_run_url(t.tracking_uri, t.experiment_id, t.mlflow_run_id),
                "git_commit": git_state().get("mlflow.source.git.commit")}

    def log(self, metrics: dict, step: int, *, group: str = "") -> None:
        """Log one step of a group of metrics once: a resumed run skips the steps any earlier
        session journaled (``Tracker.log_metrics_once``), so a group logged later in the iteration
        (``"wall"``: this process's wall times) is still written once per (key, step) whatever the
        crash point. ``runs/<id>/tracked_step[.group]`` of older versions count too."""
        legacy = self.tracker.run_dir / (f"tracked_step.{group}" if group else "tracked_step")
        self.tracker.log_metrics_once({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step,
                                      group, floor=read_int(legacy))

    def log_iteration(self, i: int, results: IterationResults, row: dict) -> None:
        """Iteration ``i``'s metrics at step ``i``: the store's ``iteration`` column; with them the
        rollout statistics RL users know (``trace_core.analysis.rollout_stats``) from the iteration's nodes."""
        nodes = read_shard(Path(results.verified.nodes))
        rollout = rollout_metrics(nodes, max_new_tokens=self.cfg.sampling.max_new_tokens,
                                  seconds=results.stage_seconds())
        stats = results.update.stats
        if stats.loss_tokens and stats.seconds:  # loss tokens trained per second, every epoch's
            rollout["time/update_tokens_per_s"] = stats.loss_tokens * self.cfg.update.ppo_epochs / stats.seconds
        self.log(iteration_metrics(results, row) | rollout, step=i)
        self.log_traces(i, results.verified.nodes)

    def log_traces(self, i: int, nodes: str) -> None:
        """A sample of iteration ``i``'s trajectories as MLflow traces, once per iteration: a
        resumed run skips the iterations whose traces record any session journaled (the journal
        sends it, during an outage too, without the iteration waiting on MLflow);
        ``runs/<id>/tracked_step.traces`` of older versions counts too."""
        done = max(read_int(self.tracker.run_dir / "tracked_step.traces"), self.tracker.logged_step("traces"))
        if i <= done or not self.cfg.tracking.trace_samples or not self.tracker.config.enabled:
            return
        self.tracker.log_traces(nodes, cap=self.cfg.tracking.trace_samples, seed=self.cfg.run.seed * 100_003 + i,
                                step=i)

    def log_evaluation(self, accuracy: Evaluation, trained: int) -> None:
        """A held-out evaluation of the policy after ``trained`` iterations, at step ``trained``
        (as the ``evaluations`` view: 0 = before training, N = the final policy)."""
        if metrics := evaluation_metrics(accuracy):
            self.log(metrics, step=trained, group="eval")

    def finish(self, history: list[dict], checkpoint: str | None = None) -> str:
        files = publish_run_artifacts(self.tracker, self.cfg)
        if checkpoint is not None and self.cfg.tracking.log_model:  # the final policy as an MLflow model
            config = next(f for f in files if f.name == "config.yaml")
            staged = model_files(checkpoint, self.tracker.run_dir / "model" / "checkpoint")
            self.tracker.log_model(staged, config, registered_model_name=self.cfg.tracking.registered_model_name,
                                   source=str(checkpoint))
        self.tracker.finish()
        if self.parent is not None:
            self.parent.finish()
        report = next((f for f in files if f.name == "report.md"), None)
        return report.read_text() if report else ""
