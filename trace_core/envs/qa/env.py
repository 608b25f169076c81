"""Multi-hop QA environment: a BM25 ``search(query)`` tool, reward by normalised exact match.

Task payload: ``{"answers": [gold, alias, ...], "paragraphs": [[title, text], ...],
"show_titles": bool, "hops": [query, ...]}``. The corpus searched is the task's own paragraphs,
or the env-wide ``corpus`` (list of ``[title, text]``) when one is given to the env. Token F1 is
logged in ``info["f1"]``; with ``partial_credit`` it is the reward.
"""

from __future__ import annotations

from trace_core.envs.actions import format_answer, format_call
from trace_core.envs.base import Task
from trace_core.envs.config import EnvConfig
from trace_core.envs.episode import Tool, ToolEpisode
from trace_core.envs.prompts import function_schema, system_prompt
from trace_core.envs.qa.answers import check_qa
from trace_core.envs.qa.search import BM25Index, cached_index, search_observation

MAX_PARAGRAPH_CHARS = 400

SEARCH_SCHEMA = function_schema("search", "Search the documents; returns the best matching paragraphs.",
                                query=("string", "keywords, e.g. a name"))


def display_paragraphs(paragraphs: list, show_titles: bool) -> tuple[str, ...]:
    """``[[title, text], ...]`` -> the strings the search tool shows (bounded length)."""
    out = []
    for p in paragraphs:
        title, text = (str(p[0]), str(p[1])) if isinstance(p, (list, tuple)) and len(p) == 2 else ("", str(p))
        s = f"{title}: {text}" if show_titles and title else text
        out.append(s[:MAX_PARAGRAPH_CHARS])
    return tuple(out)


class QAEpisode(ToolEpisode):
    def __init__(self, task: Task, cfg: EnvConfig, index: BM25Index):
        k = cfg.search_top_k
        tool = Tool("search", "search(query)", SEARCH_SCHEMA, lambda query: search_observation(index, query, k))
        self.tools = {"search": tool}
        super().__init__(task, cfg, system_prompt([tool], cfg.prompt_style))

    def finish(self, answer: str):
        golds = [str(a) for a in self.task.payload.get("answers", [])]
        reward, reason, info = check_qa(answer, golds)
        if self.cfg.partial_credit:
            reward = info["f1"]
        return reward, reason, info


class QAEnv:
    name = "qa"

    def __init__(self, cfg: EnvConfig, corpus: list | None = None):
        self.cfg = cfg
        self._shared = cached_index(display_paragraphs(corpus, True)) if corpus else None

    def reset(self, task: Task) -> QAEpisode:
        if self._shared is not None:
            index = self._shared
        else:
            p = task.payload
            index = cached_index(display_paragraphs(p.get("paragraphs", []), bool(p.get("show_titles", False))))
        return QAEpisode(task, self.cfg, index)


def demonstration(task: Task) -> list[str]:
    """One search per hop, then the first gold answer."""
    p = task.payload
    return [format_call("search", {"query": q}) for q in p.get("hops", [])] + [format_answer(p["answers"][0])]
