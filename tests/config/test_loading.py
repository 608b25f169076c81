from pathlib import Path

import pytest
import yaml

from trace_core.config import TrainConfig, load_train_config
from trace_core.config.io import ConfigError, apply_overrides, config_hash, dump_yaml, flatten
from trace_core.runtime import check_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["tiny.yaml", "small-ci.yaml", "qwen3-8b.yaml", "qwen3-14b.yaml"])
def test_shipped_configs_validate(name):
    cfg = load_train_config(CONFIGS / name)
    assert isinstance(cfg, TrainConfig)


def test_overrides_apply_and_parse_types():
    cfg = load_train_config(CONFIGS / "tiny.yaml", ["allocation.budget_total=32", "env.families={math: 1.0}",
                                                    "allocation.strategy=grpo", "run.eval_every=2"])
    assert cfg.allocation.budget_total == 32 and cfg.allocation.strategy == "grpo"
    assert cfg.env.families == {"math": 1.0} and cfg.run.eval_every == 2


@pytest.mark.parametrize("override, path, bad", [
    ("run.bogus=1", "run.bogus", "1"),
    ("allocation.budget_total=-3", "allocation.budget_total", "-3"),
    ("sampling.temperature=abc", "sampling.temperature", "'abc'"),
    ("nosection.x=1", "nosection", ""),
])
def test_bad_values_name_field_and_value(override, path, bad):
    with pytest.raises(ConfigError) as err:
        load_train_config(CONFIGS / "tiny.yaml", [override])
    assert path in str(err.value) and bad in str(err.value)


@pytest.mark.parametrize("override, path, bad", [
    ("allocation.strategy=nope", "allocation.strategy", "'nope'"),
    ("advantage.estimator=nope", "advantage.estimator", "'nope'"),
])
def test_unknown_names_are_caught_at_start(override, path, bad):
    cfg = load_train_config(CONFIGS / "tiny.yaml", [override])  # plain data: loads
    with pytest.raises(ConfigError) as err:
        check_names(cfg)
    assert path in str(err.value) and bad in str(err.value)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_train_config(tmp_path / "missing.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_train_config(p)
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["novalue"])


def test_flatten_and_hash_are_stable():
    a, b = TrainConfig(), TrainConfig()
    assert config_hash(a) == config_hash(b)
    flat = flatten(a)
    assert flat["allocation.budget_total"] == a.allocation.budget_total
    c = load_train_config(None, ["run.seed=5"])
    assert config_hash(c) != config_hash(a)


def test_flatten_and_dump_yaml_take_models_and_mappings():
    cfg = TrainConfig()
    assert flatten(cfg) == flatten(cfg.model_dump(mode="json"))
    assert flatten({"a": {"b": [1], "c": {}}, "d": None}, "p.") == {"p.a.b": [1], "p.d": None}
    assert yaml.safe_load(dump_yaml(cfg)) == cfg.model_dump(mode="json")
    assert dump_yaml(cfg) == dump_yaml(cfg.model_dump(mode="json"))
    assert list(yaml.safe_load(dump_yaml(cfg))) == list(TrainConfig.model_fields)  # declaration order
