"""MLflow tracking of one training flow run (buffered: an outage never stops training)."""

from __future__ import annotations

from trace_core.config import TrainConfig
from trace_core.results import Evaluation, IterationResults, IterationTiming
from trace_core.run import RunRef
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
    """A held-out evaluation: accuracy overall and per family, and its wall seconds."""
    probe = {} if accuracy.probe_accuracy is None else {"accuracy/probe": accuracy.probe_accuracy}
    return accuracy_metrics(accuracy.columns()) | probe | {"time/evaluate_s": accuracy.seconds}


def wall_metrics(timing: IterationTiming) -> dict[str, float]:
    """This process's wall times of an iteration (``flows.train.overhead_split``): the whole
    iteration, orchestration + tracking overhead, evaluation. The per-stage wall times equal the
    stages' own ``time/<stage>_s`` and are not logged twice."""
    return {"time/iteration_s": timing.iteration_s, "time/overhead_s": timing.overhead_s,
            "time/overhead_share": timing.overhead_share, "time/evaluate_s": timing.evaluate_s}


def iteration_metrics(results: IterationResults, row: dict) -> dict[str, float]:
    """The per-iteration metrics, grouped by ``/`` in the MLflow UI: ``effective/`` (ratio, waste),
    ``reward/``, ``budget/`` (trajectories asked / used, tokens, branching), ``accuracy/``,
    ``predictor/`` (fit, prospective Brier / AUC / ECE), ``update/`` and ``time/`` (stage seconds)."""
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
    out.update(accuracy_metrics(row))
    out.update({f"time/{k}_s": v for k, v in results.stage_seconds().items()})
    out.update({_predictor_key(k): v for k, v in ver.predictor_metrics.items()})
    return out


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
        self.tracker.log_params(cfg.model_dump(mode="json"))
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
        self.log(iteration_metrics(results, row), step=i + 1)  # step 0 = before training

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
