"""What a task family registers: its environment, its synthetic generator, its demonstration writer.

Each family package (``trace_core.envs.math``, ``.qa``, ``.fc``) registers all three under its
name when it is imported; ``trace_core.envs`` imports the built-in ones. A new family is a
package that does the same (and is imported before use). The registries are the project's
``Registry``: a duplicate name is rejected, an unknown one raises ``KeyError`` listing the known.

* env factory      ``factory(cfg: EnvConfig, **extras) -> Env``
* generator        ``make(rng, difficulty, prompt_id) -> Task``, with a ``salt`` that separates the
  family's random stream from the others' (task ``i`` draws from ``[salt, difficulty, seed, i]``)
* demonstration    ``write(task) -> [action, ...]``: the correct assistant turns for a task
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trace_core.envs.base import Env, Task
from trace_core.registry import Registry

EnvFactory = Callable[..., Env]
MakeTask = Callable[[np.random.Generator, int, str], Task]
DemoWriter = Callable[[Task], list[str]]


@dataclass(frozen=True)
class SyntheticGenerator:
    make: MakeTask
    salt: int  # first entry of every task's seed sequence; unique per family


ENVS: Registry[EnvFactory] = Registry("env")
GENERATORS: Registry[SyntheticGenerator] = Registry("generator")
DEMONSTRATIONS: Registry[DemoWriter] = Registry("demonstration writer")


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator / function registering ``factory(cfg: EnvConfig, **extras) -> Env``."""
    return ENVS.register(name)


def register_generator(family: str, salt: int) -> Callable[[MakeTask], MakeTask]:
    """Add a generator; ``salt`` separates the random streams of families (so it is unique too)."""

    def deco(make: MakeTask) -> MakeTask:
        clash = [f for f, g in GENERATORS.items() if g.salt == salt and f != family]
        if clash:
            raise ValueError(f"generator salt {salt} is already used by {clash[0]!r}")
        GENERATORS.add(family, SyntheticGenerator(make, salt))
        return make

    return deco


def register_demonstration(family: str) -> Callable[[DemoWriter], DemoWriter]:
    """Decorator / function registering ``write(task) -> [action, ...]``."""
    return DEMONSTRATIONS.register(family)
