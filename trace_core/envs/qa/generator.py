"""Synthetic multi-hop QA over a generated knowledge base of fictional entities.

Each task draws a chain of facts, one short sentence (paragraph) per fact, and asks for the end
of the chain; the corpus is those paragraphs plus distractors. Difficulty knob:

=====  ====  ===========  ==============================================
level  hops  distractors  note
=====  ====  ===========  ==============================================
0      1     0
1      2     1
2      3     2
3      3     3            distractors share a name or place with the chain
=====  ====  ===========  ==============================================

Chains: person -born in-> city -in-> country -leader-> person, and
person -works for-> company -based in-> city -in-> country. The demonstration searches one
query per hop (``Tom Vell``, ``Pardo city``, ``Kesta leader``, ``Zanco based``); the generator
checks that each query ranks its gold paragraph first under BM25, so the demo is sound for
any ``search_top_k >= 1``.
"""

from __future__ import annotations

import numpy as np

from trace_core.envs.base import Task
from trace_core.envs.qa.search import BM25Index

_C, _V = "bdfgklmnprstvz", "aeiou"
_LEVELS = {0: (1, 0), 1: (2, 1), 2: (3, 2), 3: (3, 3)}


def _syl(rng: np.random.Generator, shape: str) -> str:
    return "".join(str(rng.choice(list(_C if ch == "C" else _V))) for ch in shape).capitalize()


class _Names:
    """Fresh, task-unique invented names of a few fixed shapes."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.used = rng, set()

    def _fresh(self, make) -> str:
        while True:
            name = make()
            if name.lower() not in self.used and all(p.lower() not in self.used for p in name.split()):
                self.used.add(name.lower())
                self.used.update(p.lower() for p in name.split())
                return name

    def person(self, first: str | None = None) -> str:
        if first is not None:  # a confusable namesake: same first name, new surname
            return self._fresh_surname(first)
        return self._fresh(lambda: f"{_syl(self.rng, 'CVCV')} {_syl(self.rng, 'CVC')}")

    def _fresh_surname(self, first: str) -> str:
        while True:
            last = _syl(self.rng, "CVC")
            if last.lower() not in self.used:
                self.used.add(last.lower())
                return f"{first} {last}"

    def city(self) -> str:
        return self._fresh(lambda: _syl(self.rng, "CVCCV"))

    def country(self) -> str:
        return self._fresh(lambda: _syl(self.rng, "CVCV") + "ria")

    def company(self) -> str:
        return self._fresh(lambda: _syl(self.rng, "CVC") + "co")


def _chain(rng: np.random.Generator, names: _Names, hops: int) -> tuple[str, list[tuple[str, str, str]], str, str]:
    """(question, [(title, text, query)] per hop, answer, the chain's city)."""
    p, city, country = names.person(), names.city(), names.country()
    if rng.random() < 0.5:
        leader = names.person()
        facts = [(p, f"{p} was born in {city}.", p), (city, f"{city} is a city in {country}.", f"{city} city"),
                 (country, f"The leader of {country} is {leader}.", f"{country} leader")]
        answers = [city, country, leader]
        questions = [f"Where was {p} born?", f"In which country was {p} born?",
                     f"Who leads the country where {p} was born?"]
    else:
        co = names.company()
        facts = [(p, f"{p} works for {co}.", p), (co, f"{co} is based in {city}.", f"{co} based"),
                 (city, f"{city} is a city in {country}.", f"{city} city")]
        answers = [co, city, country]
        questions = [f"Who does {p} work for?", f"In which city is the employer of {p}?",
                     f"In which country is the employer of {p}?"]
    return questions[hops - 1], facts[:hops], answers[hops - 1], city


def _distractor(rng: np.random.Generator, names: _Names, anchor: str, city: str,
                confusable: bool) -> tuple[str, str]:
    """A fact off the chain; ``confusable``: shares the chain person's first name or city."""
    person = names.person(anchor.split()[0]) if confusable and rng.random() < 0.6 else names.person()
    place = city if confusable and rng.random() < 0.5 else names.city()
    kind = int(rng.integers(0, 3))
    if kind == 0:
        return person, f"{person} was born in {place}."
    if kind == 1:
        return person, f"{person} works for {names.company()}."
    return place, f"{place} is a city in {names.country()}."


def make_qa_task(rng: np.random.Generator, difficulty: int, prompt_id: str) -> Task:
    hops, n_distract = _LEVELS[difficulty]
    for _ in range(20):  # resample until every hop query ranks its gold paragraph first
        names = _Names(rng)
        question, chain, answer, city = _chain(rng, names, hops)
        paras = [(t, x) for t, x, _ in chain]
        paras += [_distractor(rng, names, chain[0][0], city, difficulty == 3) for _ in range(n_distract)]
        order = rng.permutation(len(paras))
        paras = [paras[i] for i in order]
        index = BM25Index(tuple(x for _, x in paras))
        gold_pos = [next(i for i, (_, x) in enumerate(paras) if x == text) for _, text, _ in chain]
        if all(index.search(q, 1) == [g] for (_, _, q), g in zip(chain, gold_pos, strict=True)):
            break
    return Task(
        prompt_id=prompt_id,
        family="qa",
        difficulty=difficulty,
        question=question,
        payload={"answers": [answer], "paragraphs": [list(p) for p in paras], "show_titles": False,
                 "hops": [q for _, _, q in chain], "source": "synthetic"},
    )
