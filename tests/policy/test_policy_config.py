"""The policy's config models are plain pydantic: loading them (and so the run config) loads no
torch, and the code modules re-export the same classes."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "tokenizers", "trace_core.policy.model", "trace_core.policy.update",
         "trace_core.policy.warmup", "trace_core.policy.tokenizer")


def _loaded_after(stmt: str) -> list[str]:
    code = f"import sys; {stmt}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_policy_config_imports_no_training_code():
    assert _loaded_after("import trace_core.policy.config") == []


def test_run_config_imports_no_policy_training_code():
    # torch may still come from other sections' modules; the policy's training code must not load
    loaded = _loaded_after("import trace_core.config")
    assert not [m for m in loaded if m.startswith("trace_core.policy.")], loaded


def test_code_modules_re_export_their_configs():
    from trace_core.policy import config, model, tokenizer, update, warmup

    assert model.ModelConfig is config.ModelConfig and model.TINY_WARM_DIR == config.TINY_WARM_DIR
    assert update.UpdateConfig is config.UpdateConfig and warmup.WarmupConfig is config.WarmupConfig
    assert tokenizer.TokenizerConfig is config.TokenizerConfig
