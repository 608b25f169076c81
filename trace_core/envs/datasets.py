"""Datasets from local files: the ``data`` section of a run config, loaded into prompt pools.

A run trains on the synthetic generators unless ``data.train`` names files. Each entry is one
local file (or, for BFCL, a directory) read by a registered loader (``trace_core.envs.loaders``:
gsm8k, math, hotpotqa, musique, xlam, bfcl) with a mixing weight::

    data:
      train:
        - {path: data/gsm8k/train.jsonl, loader: gsm8k, weight: 2.0}
        - {path: data/math/train.jsonl, loader: math, weight: 1.0, limit: 5000}
      heldout:
        - {path: data/gsm8k/test.jsonl, loader: gsm8k, limit: 500}

* **Mixing.** Each iteration's candidates are a weighted sample without replacement of the
  training rows: a file's share of the candidates is proportional to its ``weight`` (until it
  runs out), whatever its size. Prompts recur across iterations, as with ``run.train_prompts``
  (which the data section replaces).
* **Held-out.** ``heldout`` files, or ``heldout_share`` of every training file (a fixed split by
  a hash of the prompt id, the same for every seed). A held-out question is removed from the
  training rows if it appears there too.
* **Ids and cells.** Prompt ids are ``{name}:{id}`` (``name`` defaults to the file stem), so two
  files of one format do not collide. Every loader derives the difficulty bin (0-3) the cell
  prior uses from the record (GSM8K: calculator steps; MATH: level; HotpotQA: level; MuSiQue:
  hops; function calling: number of calls and functions); a record without the field gets the
  loader's middle bin. Cells are ``(family, difficulty)``: GSM8K and MATH rows share the math
  cells, and the per-prompt posterior and the text head tell them apart.
* **Corpus.** With ``corpus: dataset`` the QA search tool searches every paragraph of every QA
  row (training and held-out, deduplicated): retrieval over the whole corpus instead of each
  question's own distractor paragraphs (``corpus: task``).
* **Bad rows.** A record that is not JSON, lacks a field or has an empty question or answer is
  reported with its file and line and skipped (``on_bad_row: skip``) or stops the run
  (``error``). A missing file or an empty training or held-out set stops the run before it
  starts, with one line naming the field.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trace_core.envs import make_env, make_envs
from trace_core.envs.base import Env, Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.datasets_config import DataConfig, DatasetFile
from trace_core.envs.loaders import ROW_LOADERS, BadRow, load_rows, load_tasks

log = logging.getLogger(__name__)

#: Relative paths that do not exist from the working directory are looked up here (the checkout,
#: so ``trace_core/data/samples/...`` works from anywhere).
CHECKOUT = Path(__file__).resolve().parents[2]
MAX_REPORTED = 10  # bad rows printed one by one; the rest are counted


class DataError(ValueError):
    """A data section that cannot give a run its prompts (missing file, empty set, bad row)."""


@dataclass(frozen=True)
class LoadedData:
    """Training rows per file (mixing weights beside them), held-out rows, the QA corpus."""

    train: tuple[tuple[Task, ...], ...]
    weights: tuple[float, ...]
    heldout: tuple[Task, ...]
    corpus: tuple[tuple[str, str], ...]
    counts: dict[str, int] = field(default_factory=dict)  # tasks per file label
    problems: tuple[str, ...] = ()

    @property
    def train_tasks(self) -> tuple[Task, ...]:
        return tuple(t for part in self.train for t in part)

    @functools.cached_property
    def digest(self) -> str:
        """``dataset_digest`` of every training and held-out task: what the stages consume."""
        return dataset_digest([*self.train_tasks, *self.heldout])


def resolve(path: str) -> Path:
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return CHECKOUT / p if (CHECKOUT / p).exists() else p


def read_file(entry: DatasetFile, where: str, on_bad: str) -> tuple[list[Task], list[str]]:
    """The tasks of one file, ids prefixed with the entry's name; bad rows as problems."""

    path = resolve(entry.path)
    if not path.exists():
        raise DataError(f"{where}.path: {entry.path} not found")
    try:
        if entry.loader in ROW_LOADERS.names():
            if entry.options:
                raise DataError(f"{where}.options: the {entry.loader} loader takes none, got {entry.options}")
            tasks, problems = load_rows(entry.loader, path, limit=entry.limit, on_bad=on_bad)
        else:
            tasks, problems = load_tasks(entry.loader, path, limit=entry.limit, **entry.options), []
    except BadRow as err:
        raise DataError(str(err)) from None
    except (OSError, UnicodeDecodeError, TypeError, KeyError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{where}: cannot read {path} as {entry.loader}: {' '.join(str(err).split())[:200]}") from None
    seen: set[str] = set()
    out = []
    for t in tasks:
        pid = f"{entry.label}:{t.prompt_id}"
        if pid in seen:
            problems.append(f"{path}: duplicate prompt id {t.prompt_id!r}, kept the first")
            continue
        seen.add(pid)
        out.append(Task(pid, t.family, t.difficulty, t.question, t.payload))
    return out, problems


def _is_heldout(prompt_id: str, share: float) -> bool:
    h = int.from_bytes(hashlib.sha256(prompt_id.encode()).digest()[:8], "big")
    return h / 2**64 < share


def qa_corpus(tasks: list[Task]) -> tuple[tuple[str, str], ...]:
    """Every ``[title, text]`` paragraph of the QA tasks, deduplicated, in first-seen order."""
    seen: dict[tuple[str, str], None] = {}
    for t in tasks:
        if t.family == "qa":
            for p in t.payload.get("paragraphs", []):
                if isinstance(p, list | tuple) and len(p) == 2:
                    seen.setdefault((str(p[0]), str(p[1])), None)
    return tuple(seen)


def load_data(data: DataConfig, progress: Callable[[str], None] | None = None) -> LoadedData:
    """Read every file of ``data`` (one progress line each); raise ``DataError`` on a missing
    file, an empty training or held-out set, or (``on_bad_row: error``) the first bad row."""
    say = progress or log.info
    parts, heldout, problems, counts, labels = [], [], [], {}, {}
    for group, entries in (("train", data.train), ("heldout", data.heldout)):
        for i, entry in enumerate(entries):
            t0 = time.perf_counter()
            if (first := labels.setdefault(entry.label, f"data.{group}[{i}]")) != f"data.{group}[{i}]":
                raise DataError(f"data.{group}[{i}].name: '{entry.label}' is also {first}'s name (prompt ids would "
                                f"collide); give one a distinct name")
            tasks, bad = read_file(entry, f"data.{group}[{i}]", data.on_bad_row)
            problems += bad
            counts[f"{group}/{entry.label}"] = len(tasks)
            say(f"data.{group}[{i}] {entry.path} ({entry.loader}): {len(tasks)} tasks, {len(bad)} skipped "
                f"({time.perf_counter() - t0:.2f} s)")
            for msg in bad[:MAX_REPORTED]:
                say(f"  skipped {msg}")
            if len(bad) > MAX_REPORTED:
                say(f"  ... and {len(bad) - MAX_REPORTED} more skipped rows")
            if group == "train":
                parts.append(tasks)
            else:
                heldout += tasks
    if not data.heldout and data.heldout_share > 0:
        heldout = [t for p in parts for t in p if _is_heldout(t.prompt_id, data.heldout_share)]
        parts = [[t for t in p if not _is_heldout(t.prompt_id, data.heldout_share)] for p in parts]
    held_q = {" ".join(t.question.lower().split()) for t in heldout}
    clean = [[t for t in p if " ".join(t.question.lower().split()) not in held_q] for p in parts]
    if (dropped := sum(map(len, parts)) - sum(map(len, clean))):
        say(f"data: {dropped} training rows dropped (their question is in the held-out set)")
    for entry, p in zip(data.train, clean, strict=True):
        counts[f"train/{entry.label}"] = len(p)
    if data.train and not any(clean):
        raise DataError(f"data.train: no usable tasks in {len(data.train)} file(s) ({len(problems)} bad rows)")
    if (data.heldout or data.heldout_share > 0) and not heldout:
        where = "data.heldout" if data.heldout else "data.heldout_share"
        raise DataError(f"{where}: no usable held-out tasks ({len(problems)} bad rows)")
    corpus = qa_corpus([t for p in clean for t in p] + heldout) if data.corpus == "dataset" else ()
    say(f"data: {sum(map(len, clean))} training tasks, {len(heldout)} held-out"
        + (f", QA corpus of {len(corpus)} paragraphs" if corpus else ""))
    return LoadedData(tuple(tuple(p) for p in clean), tuple(e.weight for e in data.train), tuple(heldout),
                      corpus, counts, tuple(problems))


_LOADED: dict[str, LoadedData] = {}


def loaded(data: DataConfig, progress: Callable[[str], None] | None = None) -> LoadedData:
    """``load_data`` once per process per data section: the CLI loads it first (with progress
    lines and its one-line errors), the stages then reuse it."""
    key = data.model_dump_json()
    if key not in _LOADED:
        _LOADED[key] = load_data(data, progress)
    return _LOADED[key]


def data_envs(env: EnvConfig, data: DataConfig) -> dict[str, Env]:
    """One environment per family the data holds; QA searches the dataset corpus when set."""
    d = loaded(data)
    fams = sorted({t.family for t in d.train_tasks} | {t.family for t in d.heldout})
    return {f: make_env(f, config=env, **({"corpus": [list(p) for p in d.corpus]} if f == "qa" and d.corpus else {}))
            for f in fams}


def weighted_pick(data: LoadedData, k: int, rng: np.random.Generator) -> tuple[Task, ...]:
    """``k`` training tasks without replacement, each file's share proportional to its weight:
    keys ``log(u) / w`` with ``w = weight / file size`` per task (Efraimidis-Spirakis), top ``k``."""
    sizes = [len(p) for p in data.train]
    w = np.concatenate([np.full(n, wt / n) for n, wt in zip(sizes, data.weights, strict=True) if n])
    keys = np.log(rng.random(len(w))) / w
    pick = np.sort(np.argsort(-keys, kind="stable")[:k])
    pool = data.train_tasks
    return tuple(pool[i] for i in pick)


def heldout_pick(data: LoadedData, n: int, seed: int) -> list[Task]:
    """``n`` held-out tasks (all when fewer), a seeded shuffle spread over the cells."""
    tasks = list(data.heldout)
    order = np.random.default_rng(seed).permutation(len(tasks))
    by_cell: dict[tuple[str, int], list[Task]] = {}
    for i in order:
        by_cell.setdefault((tasks[i].family, tasks[i].difficulty), []).append(tasks[i])
    out: list[Task] = []
    cells = [by_cell[c] for c in sorted(by_cell)]
    while len(out) < n and any(cells):
        for c in cells:
            if c and len(out) < n:
                out.append(c.pop(0))
    return out


def dataset_digest(tasks: tuple[Task, ...] | list[Task]) -> str:
    """A content hash of the tasks (ids, questions, payloads), 16 hex digits."""
    import json

    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps([t.prompt_id, t.family, t.difficulty, t.question, t.payload], sort_keys=True,
                            default=str).encode())
    return h.hexdigest()[:16]


def build_environments(env: EnvConfig, data: DataConfig) -> dict[str, Env]:
    """One environment per family (the run's runtime builds them once: the QA search index is
    not free); with data files, one per family they hold, QA searching their corpus."""
    return data_envs(env, data) if data.enabled else make_envs(env)
