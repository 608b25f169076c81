"""What the stage tasks' cache trusts: result files that are data, keys that track the code.

``JsonOnlyKeyStorage`` holds the stage tasks' cache records. Prefect reads the
serializer of a cached result from the record's metadata file, so a planted record that says
``pickle`` (or a JSON serializer whose ``object_decoder`` names ``subprocess.run``) would run on
a cached replay whatever serializer the task was configured with. This storage refuses, with a
one-line ``ValueError`` naming the file, any record whose serializer is not exactly Prefect's
plain JSON serializer, and any value that is not JSON or names a class outside
``trace_core.stages.results`` (and the ``datetime`` of a recorded row) (the JSON decoder imports the ``__class__`` it is given).

``PortableInputs`` hashes the stage's inputs with the run home and the checkout written as
placeholders, and the key storage maps a record written under another home onto this one
(``moved_from``; ``rebase`` rewrites the replayed record's paths): a moved home, or a moved
checkout, replays its finished stages instead of recomputing them.

``PackageSource`` adds a digest of the ``trace_core`` package's source to the cache key, so an
edited stage (or anything a stage calls) recomputes on resume instead of replaying a stale
result. Any edit to ``trace_core`` invalidates every cached stage: conservative on purpose.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.cache_policies import CachePolicy
from prefect.filesystems import LocalFileSystem
from prefect.logging import get_logger
from prefect.serializers import JSONSerializer
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

import trace_core
from trace_core.envs.datasets import loaded
from trace_core.runtime import Runtime

ALLOWED_CLASS_PREFIX = "trace_core.stages.results."
ALLOWED_CLASSES = frozenset({"datetime.datetime", "datetime.date"})  # a recorded row's timestamps
log = get_logger("trace_rl.cache")
CHECKOUT = str(Path(trace_core.__file__).resolve().parent)  # the package dir: shipped checkpoints live here

# values dir of this process's stage tasks -> the home its replayed records were written under
_MOVED: dict[str, str] = {}


def _swap_prefix(obj: Any, old: str, new: str) -> Any:
    """``obj`` (JSON-like) with every string equal to ``old`` or under ``old/`` re-rooted at ``new``."""
    if isinstance(obj, str):
        return new + obj[len(old):] if obj == old or obj.startswith(old + "/") else obj
    if isinstance(obj, dict):
        return {k: _swap_prefix(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_swap_prefix(v, old, new) for v in obj]
    return obj


def moved_from(home: str | Path) -> str | None:
    """The home that records replayed in ``home`` this process were written under, if it was another."""
    return _MOVED.get(str(Path(home).resolve() / "prefect-results" / "values"))


def rebase(record: Any, home: str | Path) -> Any:
    """``record`` (a stage's result) with paths under the home it was written in moved to ``home``."""
    old = moved_from(home)
    if old is None:
        return record
    new = str(Path(home).resolve())
    if isinstance(record, BaseModel):
        return type(record).model_validate(_swap_prefix(record.model_dump(mode="json"), old, new))
    return _swap_prefix(record, old, new) if isinstance(record, dict | list | str) else record


@functools.cache
def _expected_serializer() -> dict[str, Any]:
    return json.loads(JSONSerializer().model_dump_json())


def _walk(obj: Any):
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def check_record(path: str, content: bytes) -> dict:
    """``content`` parsed, if it is a JSON result / metadata record we wrote; ``ValueError`` otherwise."""
    try:
        data = json.loads(content)
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{path}: cached result is not JSON; refusing to load it (never unpickled)") from None
    for node in _walk(data):
        if not isinstance(node, dict):
            continue
        if "serializer" in node and node["serializer"] != _expected_serializer():
            kind = node["serializer"].get("type") if isinstance(node["serializer"], dict) else node["serializer"]
            raise ValueError(f"{path}: cached result declares serializer {kind!r} (or non-default options); "
                             "refusing to load it (only plain JSON is trusted)")
        cls = node.get("__class__")
        if cls is not None and not (isinstance(cls, str) and (cls.startswith(ALLOWED_CLASS_PREFIX)
                                                             or cls in ALLOWED_CLASSES)):
            raise ValueError(f"{path}: cached result names class {cls!r}; only {ALLOWED_CLASS_PREFIX}* is loaded")
        if "__exc_type__" in node:
            raise ValueError(f"{path}: cached result holds an exception; refusing to load it")
    return data if isinstance(data, dict) else {}


class JsonOnlyKeyStorage(LocalFileSystem):
    """The cache's metadata (key) directory. A record is handed to Prefect only after it and the
    value file it points at pass ``check_record``, and only if that value lies under
    ``values_basepath`` (Prefect then decodes the value with the serializer checked here).

    (The value directory itself must be a plain ``Path`` for Prefect: an unsaved block is refused
    as ``result_storage``, hence the check of values from here.)
    """

    _block_type_name = "Trace RL JSON-only cache keys"
    values_basepath: str

    def _checked(self, path: str, content: bytes) -> bytes:
        try:
            meta = check_record(path, content)
            values = Path(self.values_basepath).resolve()
            key = meta.get("storage_key")
            if isinstance(key, str) and (moved := self._moved_value(values, key)) is not None:
                meta["storage_key"] = key = str(moved)  # written under a home since moved here
                content = json.dumps(meta).encode()
            value = Path(key).resolve() if isinstance(key, str) else None
            if value is None or values not in value.parents:
                raise ValueError(f"{path}: cached result points outside {values} ({key!r}); refusing to load it")
            if value.is_file():
                check_record(str(value), value.read_bytes())
        except ValueError as err:  # Prefect treats a failed read as a cache miss: say why
            log.warning("%s (the stage is recomputed)", err)
            raise
        return content

    @staticmethod
    def _moved_value(values: Path, key: str) -> Path | None:
        """Where a record's value is now, if the record names ``OLD/prefect-results/values/<name>``
        of another home and ``<name>`` is in this one (the home was moved or copied)."""
        old = Path(key)
        if old.parent == values or old.parent.parts[-2:] != ("prefect-results", "values"):
            return None
        here = values / old.name
        if not here.is_file():
            return None
        _MOVED[str(values)] = str(old.parent.parent.parent)
        return here

    async def aread_path(self, path: str) -> bytes:
        return self._checked(path, await super().aread_path(path))

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:  # Prefect passes _sync
        return self._checked(path, LocalFileSystem.read_path(self, path, _sync=True))


def source_digest(root: Path) -> str:
    """sha256 over the ``*.py`` files under ``root`` (relative path + bytes): moves of the
    checkout do not change it, an edit anywhere does."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def package_digest() -> str:
    """``source_digest`` of the ``trace_core`` package, computed once a process (~100 files)."""
    return source_digest(Path(trace_core.__file__).resolve().parent)


@dataclass
class PortableInputs(CachePolicy):
    """Cache key component: the task's inputs, with paths under ``home`` and under the checkout's
    ``trace_core`` package written relative to them (a moved home or checkout keeps its keys)."""

    home: str = ""
    # run settings that change what is kept or how long a stage may take, never what it computes
    ignored_run_fields: tuple[str, ...] = ("keep_checkpoints", "keep_best_checkpoint", "stage_timeout_s")

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: Any, **kwargs: Any) -> str:
        # the run's runtime (environments, live policy, rollout workers) changes how a stage runs, never what it computes
        inputs = {k: v for k, v in (inputs or {}).items() if not isinstance(v, Runtime)}
        data = to_jsonable_python(inputs)
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(value.get("run"), dict):  # a TrainConfig
                for name in self.ignored_run_fields:
                    value["run"].pop(name, None)
                if getattr(getattr(inputs[key], "data", None), "enabled", False):  # dataset files: the tasks read from them, not only their names
                    value["data_digest"] = loaded(inputs[key].data).digest
        data = _swap_prefix(_swap_prefix(data, str(Path(self.home).resolve()), "${home}"), CHECKOUT, "${trace_core}")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class PackageSource(CachePolicy):
    """Cache key component: the ``trace_core`` source digest (what a stage really runs)."""

    def compute_key(self, task_ctx: Any, inputs: Any, flow_parameters: Any, **kwargs: Any) -> str:
        return package_digest()  # looked up at call time (tests swap it)
