#!/usr/bin/env bash
# GPU check (issues 20, 26, 32), one command for the lent GPU machine (no network; see docs/vllm.md, "GPU"):
#
#   python scripts/gpu_wheels.py             # here, beforehand: the wheels it lacks, into .whl/
#   bash benchmarks/gpu_check.sh             # there (carry .whl): estimated 6-8 min on one H200, 9 at most
#   bash benchmarks/gpu_check.sh --dry-run   # anywhere: the same on a tiny model, seconds (tests/test_gpu_check.py)
#
# Installs the carried wheels the machine lacks into $GPU_CHECK_SITE (default /tmp/dynalize-site),
# then runs benchmarks/gpu_check.py (what it measures: its docstring). Everything printed also goes
# to $OUT/gpu_check.log; the result files go to $OUT (default runs/gpu_check, git-ignored), at most 8.
# Other arguments are passed to gpu_check.py. Exit code: gpu_check.py's (1 when a part failed), 124
# when it ran past $GPU_CHECK_TIMEOUT seconds (default 540; results.json keeps the parts done).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-$PWD/runs/gpu_check}"
SITE="${GPU_CHECK_SITE:-/tmp/dynalize-site}"
mkdir -p "$OUT"
{
  echo "== gpu_check $(date -u +%FT%TZ) on $(hostname), output in $OUT"
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "== carried wheels -> $SITE"
    PIP_ROOT_USER_ACTION=ignore "$PY" scripts/gpu_wheels.py install "$SITE"
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "== no carried wheels (.whl/): the environment is used as it is"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  timeout "${GPU_CHECK_TIMEOUT:-540}" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@"
} 2>&1 | tee "$OUT/gpu_check.log"
