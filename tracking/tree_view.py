"""The rollout trees of a run as static HTML (a section of ``trace-rl report``): for the prompts
with the most wasted trajectories, or a chosen one, every node of the tree with what was predicted
there against what happened: the predicted success V at the root and at each prefix, the
allocation decided there (m rollouts, K continuations), the predicted probability that a
continuation flips the raw trajectory's reward against the flips observed, each leaf's reward and
reason, and the tokens spent below each node. Nested ``<details>`` elements: no script, no
network; every text from the store is escaped."""

from __future__ import annotations

import html
from collections import defaultdict
from pathlib import Path

import polars as pl

from trace_core.store import query, sql_dir

TREE_CSS = """
.tree ul { list-style: none; margin: 0; padding-left: 18px; border-left: 1px dashed #d0d7de; }
.tree > ul { border-left: none; padding-left: 0; }
.tree li { margin: 2px 0; }
.tree summary { cursor: pointer; }
.tree .t { color: #57606a; font-size: 12px; }
.tree .a { font-family: ui-monospace, monospace; font-size: 12px; background: #f6f8fa; padding: 0 4px; }
.tree .b { display: inline-block; border-radius: 10px; padding: 0 7px; font-size: 11.5px; margin-left: 4px;
           border: 1px solid #d0d7de; background: #fff; }
.tree .ok { background: #dafbe1; border-color: #4ac26b; }
.tree .bad { background: #ffebe9; border-color: #ff8182; }
.tree .flip { background: #fff8c5; border-color: #d4a72c; font-weight: 600; }
.tree .br { background: #ddf4ff; border-color: #54aeff; font-weight: 600; }
.tree .ext > details > summary, .tree .ext.leaf { border-left: 3px solid #54aeff; padding-left: 4px; }
"""

_TEXT = 70  # characters of an action / observation shown in a node's line


def tree_nodes(home: str | Path, run_id: str, *, trees: int = 3, prompt_id: str | None = None) -> pl.DataFrame:
    """The nodes of the ``trees`` (iteration, prompt) trees with the most wasted trajectories
    (``sql/catalog/report_tree_nodes.sql``), or of ``prompt_id``'s."""
    text = (sql_dir() / "catalog" / "report_tree_nodes.sql").read_text()
    return query(home, text, {"run_id": run_id, "trees": trees, "prompt_id": prompt_id})


def _short(text: str | None) -> str:
    t = " ".join((text or "").split())
    return html.escape(t if len(t) <= _TEXT else t[: _TEXT - 1] + "…")


def _badge(text: str, cls: str = "") -> str:
    return f'<span class="b {cls}">{html.escape(text)}</span>'


def _fmt(v: float | None, pattern: str = "{:.2f}") -> str:
    return "–" if v is None else pattern.format(v)


class _Tree:
    """One (iteration, prompt) tree: nodes by id, children by parent, each trajectory's reward."""

    def __init__(self, rows: list[dict]):
        self.rows = {r["node_id"]: r for r in rows}
        self.children: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r["parent_id"] is not None:
                self.children[r["parent_id"]].append(r)
        self.reward = {r["trajectory_id"]: r["reward"] for r in rows if r["is_leaf"]}
        self.root = next(r for r in rows if r["depth"] == 0)
        self.tokens = self._tokens(self.root)

    def _tokens(self, node: dict, acc: dict | None = None) -> dict:
        acc = {} if acc is None else acc
        acc[node["node_id"]] = (node["new_tokens"] or 0) + sum(self._tokens(c, acc)[c["node_id"]]
                                                             for c in self.children[node["node_id"]])
        return acc

    def continuations(self, node: dict) -> list[dict]:
        """Children that start a continuation from ``node`` (a trajectory other than its own)."""
        return [c for c in self.children[node["node_id"]] if node["depth"] > 0 and c["trajectory_id"] != node["trajectory_id"]]

    def leaves_below(self, node: dict) -> list[dict]:
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            kids = self.children[n["node_id"]]
            out += [n] if n["is_leaf"] else []
            stack += kids
        return out


def _node_line(tree: _Tree, n: dict) -> tuple[str, str]:
    """(CSS classes, the summary line) of one node."""
    cls = ["node", "leaf" if n["is_leaf"] else "", "ext" if n["origin"] == "extension" else ""]
    parts: list[str] = []
    if n["depth"] == 0:
        cls.append("root")
        parts.append(f'<b>prompt {html.escape(str(n["prompt_id"]))}</b> <span class="t">{html.escape(str(n["task"]))} '
                     f'd{n["difficulty"]}</span>')
        parts.append(_badge(f"m = {n['alloc_children'] or 0} rollouts"))
        parts.append(_badge(f"V̂ = {_fmt(n['v_pred'])}"))
    else:
        parts.append(f'<span class="t">turn {n["depth"]} · {html.escape(str(n["origin"]))}</span> '
                     f'<span class="a">{_short(n["action_text"])}</span>')
        if n["observation_text"]:
            parts.append(f'<span class="t">→ {_short(n["observation_text"])}</span>')
    conts = tree.continuations(n)
    if conts:
        cls.append("branch")
        r, v = tree.reward.get(n["trajectory_id"]), n["v_pred"]
        p_flip = None if r is None or v is None else r * (1 - v) + (1 - r) * v
        ends = [leaf for c in conts for leaf in tree.leaves_below(c)]
        flipped = sum(1 for e in ends if e["flipped"])
        parts.append(_badge(f"branch: K = {len(ends)} · V̂ = {_fmt(v)} · p(flip) = {_fmt(p_flip)} · "
                            f"flipped {flipped}/{len(ends)}", "br"))
    if n["is_leaf"]:
        ok = (n["reward"] or 0) >= 1
        parts.append(_badge(f"reward {_fmt(n['reward'], '{:g}')}" + (f" · {n['reward_reason']}" if n["reward_reason"]
                                                                     else ""), "ok" if ok else "bad"))
        if n["flipped"] is not None:
            parts.append(_badge("flipped" if n["flipped"] else "same as raw", "flip" if n["flipped"] else ""))
    if not n["is_leaf"]:
        parts.append(f'<span class="t">{tree.tokens[n["node_id"]]} tokens below</span>')
    return " ".join(c for c in cls if c), " ".join(parts)


def _render(tree: _Tree, n: dict) -> str:
    cls, line = _node_line(tree, n)
    kids = sorted(tree.children[n["node_id"]], key=lambda c: (c["trajectory_id"] != n["trajectory_id"], c["node_id"]))
    if not kids:
        return f'<li class="{cls}" data-node="{html.escape(n["node_id"])}">{line}</li>'
    inner = "".join(_render(tree, c) for c in kids)
    return (f'<li class="{cls}" data-node="{html.escape(n["node_id"])}"><details open><summary>{line}</summary>'
            f"<ul>{inner}</ul></details></li>")


def render_trees(frame: pl.DataFrame) -> list[str]:
    """One HTML block per tree in ``frame`` (``tree_nodes``), in its order."""
    blocks = []
    for key in frame.select("iteration", "prompt_id").unique(maintain_order=True).iter_rows():
        rows = frame.filter((pl.col("iteration") == key[0]) & (pl.col("prompt_id") == key[1])).to_dicts()
        if not any(r["depth"] == 0 for r in rows):
            continue
        tree = _Tree(rows)
        n_branch = sum(1 for r in rows if tree.continuations(r))
        head = (f"iteration {key[0]} · prompt {html.escape(str(key[1]))}: {rows[0]['tree_trajectories']} trajectories, "
                f"{rows[0]['tree_wasted']} wasted, {n_branch} branch points, {len(rows)} nodes")
        blocks.append(f'<div class="tree" data-iteration="{key[0]}" data-prompt="{html.escape(str(key[1]))}">'
                      f"<h3>{head}</h3><ul>{_render(tree, tree.root)}</ul></div>")
    return blocks
