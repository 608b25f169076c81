"""Node -> features: hashed n-grams of the prompt / path text, structure, policy signals.

``featurize(nodes, cfg) -> FeatureBatch``:

* sparse (an EmbeddingBag input): hashed word n-grams in three namespaces, each block scaled
  by ``1/sqrt(#grams)`` so long paths do not swamp short ones:
  ``q`` the question (the root's ``action_text``, or a ``question`` column), ``a``/``o`` (or ``p``
  for a ``path_text``) every turn on the path so far as unigrams, ``l``/``lo`` the node's own
  (latest) turn; plus categorical tokens
  (``task``, ``task x difficulty``, depth, tool errors, answered).
* dense ``(n, len(DENSE_NAMES))`` float32: structure and policy signals (see ``DENSE_NAMES``).

The path of a prefix comes from a ``path_text`` column when present (non-null), otherwise from
following ``parent_id`` through the rows of the same frame (see ``base`` for the convention).
NaN in a numeric feature column raises ``ValueError`` naming the column; missing values (null,
e.g. the log-probs of a root) are filled and flagged.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from trace_core.predictor.config import FeatureConfig

_TOKEN = re.compile(r"[a-z_]+|\d+|[^\sa-z_\d]")
NUMERIC_COLUMNS = ("mean_logprob", "min_logprob", "difficulty", "depth", "tool_errors")
DENSE_NAMES = (
    "is_root",
    "depth",
    "tool_errors",
    "any_tool_error",
    "answered",
    "mean_logprob",
    "min_logprob",
    "logprob_missing",
    "difficulty",
    "difficulty_missing",
)
LOGPROB_FLOOR = -30.0  # a -inf token log-prob (prob underflow) is clipped here, not rejected


@dataclass(frozen=True)
class FeatureBatch:
    """Shapes: ``idx``/``vals`` ``(nnz,)``, ``offsets`` ``(n,)`` (EmbeddingBag layout), ``dense`` ``(n, d)``."""

    idx: np.ndarray  # int64 bucket ids in [0, 2**hash_bits)
    vals: np.ndarray  # float32 per-entry weights
    offsets: np.ndarray  # int64 start of each node's entries in idx
    dense: np.ndarray  # float32

    @property
    def n(self) -> int:
        return len(self.offsets)

    def take(self, rows: np.ndarray) -> FeatureBatch:
        """The sub-batch of ``rows`` (int indices), in that order."""
        ends = np.append(self.offsets[1:], len(self.idx))
        starts, stops = self.offsets[rows], ends[rows]
        pieces = [np.arange(a, b) for a, b in zip(starts, stops, strict=True)]
        sel = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        lengths = stops - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(rows) else lengths
        return FeatureBatch(self.idx[sel], self.vals[sel], offsets, self.dense[rows])


def check_no_nan(nodes: pl.DataFrame) -> None:
    """Raise ``ValueError`` naming the first numeric feature column that holds NaN."""
    for col in NUMERIC_COLUMNS:
        if col in nodes.columns and nodes[col].dtype.is_float() and nodes[col].is_nan().any():
            raise ValueError(f"predictor features: column {col!r} contains NaN")


class _Hasher:
    """Deterministic (crc32, not Python's salted hash) n-gram hashing with a per-token cache."""

    def __init__(self, cfg: FeatureConfig):
        self.cfg = cfg
        self.mask = (1 << cfg.hash_bits) - 1
        self._cache: dict[str, int] = {}

    def _h(self, gram: str) -> int:
        v = self._cache.get(gram)
        if v is None:
            v = zlib.crc32(gram.encode()) & self.mask
            self._cache[gram] = v
        return v

    def grams(self, ns: str, text: str | None, ngram_max: int | None = None) -> np.ndarray:
        """Hashed bucket ids of the 1..ngram_max word grams of ``text`` in namespace ``ns``."""
        if not text:
            return np.zeros(0, dtype=np.int64)
        toks = _TOKEN.findall(text[-self.cfg.max_text_chars :].lower())
        # numbers also emit their digit count: "37" and "52" share the shape of a 2-digit operand
        toks = [t if not t.isdigit() else f"{t} #{len(t)}" for t in toks]
        toks = " ".join(toks).split()
        out = [self._h(f"{ns}:{t}") for t in toks]
        for n in range(2, (ngram_max or self.cfg.ngram_max) + 1):
            out += [self._h(f"{ns}:" + " ".join(toks[i : i + n])) for i in range(len(toks) - n + 1)]
        return np.asarray(out, dtype=np.int64)

    def tokens(self, ns: str, items: list[str]) -> np.ndarray:
        return np.asarray([self._h(f"{ns}:{t}") for t in items], dtype=np.int64)


def _col(nodes: pl.DataFrame, name: str) -> list:
    return nodes[name].to_list() if name in nodes.columns else [None] * nodes.height


def _paths(nodes: pl.DataFrame) -> tuple[list[str | None], list[list[int]]]:
    """Per row: the question text and the row indices of its path's turns (root excluded, in order)."""
    ids, parents = _col(nodes, "node_id"), _col(nodes, "parent_id")
    depth = nodes["depth"].fill_null(0).to_list()
    row_of = {nid: i for i, nid in enumerate(ids) if nid is not None}
    question_of: dict[str, str] = {}
    for pid, d, a in zip(_col(nodes, "prompt_id"), depth, _col(nodes, "action_text"), strict=True):
        if d == 0 and a is not None:
            question_of.setdefault(pid, a)
    qcol, acts = _col(nodes, "question"), _col(nodes, "action_text")
    questions, paths = [], []
    memo: dict[int, list[int]] = {}

    def path_rows(i: int) -> list[int]:
        # iterative walk up parent_id; memoised so a tree costs O(nodes) overall
        chain, j = [], i
        while j is not None and j not in memo and depth[j] > 0:
            chain.append(j)
            j = row_of.get(parents[j])
        base = memo.get(j, []) if j is not None else []
        for k in reversed(chain):
            base = base + [k]
            memo[k] = base
        return memo.get(i, [])

    for i, pid in enumerate(_col(nodes, "prompt_id")):
        questions.append(qcol[i] or (acts[i] if depth[i] == 0 else question_of.get(pid)))
        paths.append(path_rows(i) if depth[i] > 0 else [])
    return questions, paths


def node_texts(nodes: pl.DataFrame, max_chars: int = 4000) -> list[str]:
    """One text per row: the question, then every turn on the path (action, observation), last
    ``max_chars`` characters kept (the latest turns matter most)."""
    questions, paths = _paths(nodes)
    acts, obs, ptext = _col(nodes, "action_text"), _col(nodes, "observation_text"), _col(nodes, "path_text")
    out = []
    for i, q in enumerate(questions):
        turns = [ptext[i]] if ptext[i] else [f"{acts[k] or ''}\n{obs[k] or ''}" for k in paths[i]]
        out.append("\n".join([q or "", *turns])[-max_chars:])
    return out


def _block(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids, np.full(len(ids), 1.0 / np.sqrt(max(len(ids), 1)), dtype=np.float32)


def featurize(nodes: pl.DataFrame, cfg: FeatureConfig) -> FeatureBatch:
    """Features of every row of ``nodes`` (NODE_SCHEMA columns; extra ``path_text``/``question`` used)."""
    check_no_nan(nodes)
    h = _Hasher(cfg)
    n = nodes.height
    questions, paths = _paths(nodes)
    acts, obs = _col(nodes, "action_text"), _col(nodes, "observation_text")
    ptext = _col(nodes, "path_text")
    depth = nodes["depth"].fill_null(0).to_numpy().astype(np.float32)
    errs = _col(nodes, "tool_errors")
    errs = np.asarray([e or 0 for e in errs], dtype=np.float32)
    answered = np.asarray([bool(a) for a in _col(nodes, "answered")], dtype=np.float32)
    task, diff = _col(nodes, "task"), _col(nodes, "difficulty")
    turn_cache: dict[int, np.ndarray] = {}

    def turn(i: int) -> np.ndarray:
        if i not in turn_cache:
            # the whole path as a bag of words (unigrams): bigrams here cost most of the entries
            turn_cache[i] = np.concatenate([h.grams("a", acts[i], 1), h.grams("o", obs[i], 1)])
        return turn_cache[i]

    idx, vals, offsets, q_cache, pos = [], [], np.zeros(n, dtype=np.int64), {}, 0
    for i in range(n):
        q = questions[i]
        if q not in q_cache:
            q_cache[q] = h.grams("q", q)
        blocks = [[q_cache[q]]]
        if depth[i] > 0:
            blocks.append([h.grams("p", ptext[i], 1)] if ptext[i] else [turn(k) for k in paths[i]])
            blocks.append([h.grams("l", acts[i]), h.grams("lo", obs[i])])
        cats = [f"task={task[i]}", f"diff={task[i]}:{diff[i]}", f"depth={min(int(depth[i]), 8)}"]
        cats += [f"err={min(int(errs[i]), 3)}", f"ans={int(answered[i])}", f"root={int(depth[i] == 0)}"]
        blocks.append([h.tokens("c", cats)])
        offsets[i] = pos
        bi, bv = zip(*(_block(b) for b in blocks), strict=True)
        # merge repeated buckets (the same tool-call tokens recur every turn): 3-5x fewer entries
        uniq, inv = np.unique(np.concatenate(bi), return_inverse=True)
        idx.append(uniq)
        vals.append(np.bincount(inv, weights=np.concatenate(bv)).astype(np.float32))
        pos += len(uniq)
    dense = _dense(nodes, depth, errs, answered)
    idx_arr = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
    vals_arr = np.concatenate(vals) if vals else np.zeros(0, dtype=np.float32)
    return FeatureBatch(idx_arr, vals_arr, offsets, dense)


def _dense(nodes: pl.DataFrame, depth: np.ndarray, errs: np.ndarray, answered: np.ndarray) -> np.ndarray:
    """``(n, len(DENSE_NAMES))`` float32, column order = DENSE_NAMES (unstandardised)."""

    def floats(name: str) -> np.ndarray:
        if name not in nodes.columns:
            return np.full(nodes.height, np.nan)
        return nodes[name].cast(pl.Float64).to_numpy()  # null -> nan here (NaN proper was rejected)

    mean_lp, min_lp, diff = floats("mean_logprob"), floats("min_logprob"), floats("difficulty")
    lp_missing = np.isnan(mean_lp) | np.isnan(min_lp)
    mean_lp = np.clip(np.nan_to_num(mean_lp, nan=0.0, neginf=LOGPROB_FLOOR), LOGPROB_FLOOR, 0.0)
    min_lp = np.clip(np.nan_to_num(min_lp, nan=0.0, neginf=LOGPROB_FLOOR), LOGPROB_FLOOR, 0.0)
    diff_missing = np.isnan(diff)
    cols = [
        depth == 0,
        depth,
        errs,
        errs > 0,
        answered,
        mean_lp,
        min_lp,
        lp_missing,
        np.nan_to_num(diff, nan=0.0),
        diff_missing,
    ]
    return np.stack([np.asarray(c, dtype=np.float32) for c in cols], axis=1)
