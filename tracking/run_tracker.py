"""MLflow tracking of one training flow run (buffered: an outage never stops training)."""

from __future__ import annotations

from trace_core.config import TrainConfig
from trace_core.results import IterationResults
from trace_core.run import RunRef
from tracking.mlflow_tracker import Tracker
from tracking.report import publish_run_artifacts


def iteration_metrics(results: IterationResults, row: dict) -> dict[str, float]:
    """The per-iteration metrics: effective ratio, waste, accuracy, budget, tokens, predictor
    fit, update loss and stage timings."""
    ver, fit = results.verified, results.predictor.fit
    out = {k: getattr(ver, k) for k in ("effective_ratio", "wasted_share", "effective_per_1k_tokens", "train_reward",
                                         "wasted", "reward_mismatches", "confirmed_confident_share")}
    out.update(budget_asked=row["budget_asked"], budget_used=row["budget_used"], tokens=row["tokens"],
               raw_tokens_per_s=results.raw.tokens_per_s, expected_contrastive=results.roots.expected_contrastive,
               prefixes_branched=results.prefixes.branched, predictor_train_loss=fit.get("train_loss"),
               predictor_labelled=fit.get("n_labelled"))
    out.update({f"update_{k}": v for k, v in results.update.stats.items()})
    out.update({k: v for k, v in row.items() if k.startswith("accuracy") and v is not None})
    out.update({f"seconds_{k}": v for k, v in results.stage_seconds().items()})
    out.update({f"predictor_{k}": v for k, v in ver.predictor_metrics.items()})
    return out


class RunTracker:
    """One MLflow run per training run (a child of ``parent`` for ``compare``). Steps are the
    iteration numbers, so a resumed run continues its curves without gaps or repeats."""

    def __init__(self, ref: RunRef, cfg: TrainConfig, *, tracking_uri: str | None = None, parent: str | None = None):
        tcfg = cfg.tracking.model_copy(update={"tracking_uri": tracking_uri or cfg.tracking.tracking_uri})
        self.parent = Tracker(ref.home, parent, config=tcfg) if parent else None
        self.cfg = cfg
        self.tracker = Tracker(ref.home, ref.run_id, config=tcfg, parent=self.parent,
                               tags={"trace_rl.strategy": cfg.allocation.strategy})
        self.tracker.log_params(cfg.model_dump(mode="json"))

    def log(self, metrics: dict, step: int, *, group: str = "") -> None:
        """Log one step of a group of metrics once: a resumed run skips the steps its crashed
        predecessor logged. Each ``group`` keeps its own marker (``runs/<id>/tracked_step[.group]``),
        so a group logged later in the iteration (``"wall"``: this process's wall times) is still
        written once per (key, step) whatever the crash point."""
        marker = self.tracker.run_dir / (f"tracked_step.{group}" if group else "tracked_step")
        done = int(marker.read_text()) if marker.is_file() else -1
        if step <= done:
            return
        self.tracker.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=step)
        if self.tracker.flush(timeout=5.0):  # sent: a crash from here on must not log it twice
            marker.write_text(str(step))

    def log_iteration(self, i: int, results: IterationResults, row: dict) -> None:
        self.log(iteration_metrics(results, row), step=i + 1)  # step 0 = before training

    def finish(self, history: list[dict]) -> str:
        files = publish_run_artifacts(self.tracker, self.cfg)
        self.tracker.finish()
        if self.parent is not None:
            self.parent.finish()
        report = next((f for f in files if f.name == "report.md"), None)
        return report.read_text() if report else ""
