"""YAML + ``--set a.b=value`` overrides onto pydantic config models, with errors that name
the field path and the bad value."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that does not fit the model; the message names the field."""


MAX_CONFIG_BYTES = 1_000_000  # a run config is a few KB; anything larger is not one
MAX_YAML_NODES = 100_000  # values after alias expansion; a run config has a few hundred
MAX_YAML_CHARS = 10 * MAX_CONFIG_BYTES  # scalar text after alias expansion
MAX_SHOWN = 200  # characters of a bad value quoted in an error


class _Bomb(Exception):
    pass


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(nodes, scalar characters) of the document with every alias expanded, without expanding
    it: each shared node is sized once. A node that contains itself raises ``_Bomb``."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _Bomb("an alias refers to a node that contains it (a recursive alias)")
        active.add(key)
        if isinstance(node, yaml.ScalarNode):
            out = (1, len(node.value))
        else:
            kids = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else node.value
            n, c = 1, 0
            for kid in kids:
                kn, kc = size(kid)
                n, c = n + kn, c + kc
                if n > MAX_YAML_NODES or c > MAX_YAML_CHARS:
                    raise _Bomb(f"it expands past {MAX_YAML_NODES} values or {MAX_YAML_CHARS} characters "
                                "(aliases that multiply, a 'billion laughs')")
            out = (n, c)
        active.discard(key)
        sizes[key] = out
        return out

    return size(root)


def safe_yaml(text: str, what: str) -> Any:
    """``yaml.safe_load`` with aliases bounded (``MAX_YAML_NODES`` values, ``MAX_YAML_CHARS``
    characters after expansion, none recursive); ``ConfigError`` naming ``what`` otherwise."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return loader.construct_document(node)
    except _Bomb as err:
        raise ConfigError(f"{what} is refused: {err}") from None
    except RecursionError:
        raise ConfigError(f"{what} is refused: nested too deeply") from None
    finally:
        loader.dispose()


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def read_yaml_mapping(path: str | Path) -> dict:
    """The mapping in YAML file ``path``; ``ConfigError`` (one line, naming the file) for a
    missing / unreadable / oversized file, non-UTF-8 text, NUL bytes, malformed YAML or a
    top level that is not a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise ConfigError(f"config file {p} cannot be read: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {p} is {len(raw)} bytes; a config is at most {MAX_CONFIG_BYTES}")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"config file {p} holds a NUL byte (at byte {nul}): not a YAML text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte {err.start})") from None
    try:
        loaded = safe_yaml(text, f"config file {p}")
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {p} is not valid YAML: {_one_line(err)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return loaded


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (['a', 'b'], value parsed as YAML: numbers, bools, lists, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = safe_yaml(raw, f"override {key.strip()!r}") if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with each ``a.b=value`` applied (nested dicts created)."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            if node.get(part) is None:  # a section not set yet (absent or null) is created
                node[part] = {}
            nxt = node[part]
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return out


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        bad = e.get("input")
        shown = repr(bad) if not isinstance(bad, dict) else "{...}"
        shown = shown if len(shown) <= MAX_SHOWN else shown[:MAX_SHOWN] + f"... ({len(shown)} characters)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown key (value {shown})")
        else:
            lines.append(f"  {path}: {e['msg']} (got {shown})")
    return "invalid config:\n" + "\n".join(lines)


def validate(model: type[M], data: dict) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_explain(err)) from None


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | None = None) -> M:
    """Load YAML ``path`` (or the model's defaults), apply overrides, validate."""
    data: dict = {}
    if path is not None:
        data = read_yaml_mapping(path)
    elif overrides:
        # start from the defaults, so that --set a.b=x keeps a section's other defaults (a
        # section default set by its parent model, e.g. a simulator budget, is not reset)
        try:
            data = model().model_dump(mode="json")
        except ValidationError:
            data = {}
    data = apply_overrides(data, overrides or [])
    return validate(model, data)


def _plain(cfg: BaseModel | Mapping[str, Any]) -> Mapping[str, Any]:
    return cfg.model_dump(mode="json") if isinstance(cfg, BaseModel) else cfg


def flatten(cfg: BaseModel | Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flat ``a.b -> value`` dict (for MLflow params and Prefect parameters); values unchanged."""
    out: dict[str, Any] = {}
    for k, v in _plain(cfg).items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_hash(cfg: BaseModel) -> str:
    """Stable 12-hex hash of the validated config (cache keys, recipe records)."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def dump_yaml(cfg: BaseModel | Mapping[str, Any]) -> str:
    """The config as YAML, fields in declaration order (the run's ``config.yaml`` artifact)."""
    return yaml.safe_dump(dict(_plain(cfg)), sort_keys=False)
