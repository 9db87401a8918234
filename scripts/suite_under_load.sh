#!/usr/bin/env bash
# The test suite N times in a row on a fresh clone of HEAD while another process keeps one core
# busy: the proof that no test depends on timing, scheduling or an idle machine.
#
#   bash scripts/suite_under_load.sh [--runs N] [PYTEST ARGS ...]
#
# Clones this repository's HEAD (committed work only) into a temporary directory, starts one
# busy loop pinned to one core (taskset, where there is one), runs the README's test command
# (`python -m pytest -q`, plus any PYTEST ARGS, e.g. `-k faults` or a test file) N times (default
# 5) in the clone, with the clone first on PYTHONPATH so its code is what runs, prints each run's
# closing line and then "N passed runs, M failed runs". The busy loop is killed and the clone
# removed on exit, whatever happened (a failed run's output is kept, its path printed, and so is the
# whole output of any multi-process launch that failed, in launch_logs/: tests/launchlog.py). Exit
# status: 0 when every run passed, 1 otherwise, 2 for bad arguments. PYTHON picks the interpreter
# (default: python).
set -uo pipefail

runs=5
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) [ $# -ge 2 ] || { echo "error: --runs needs a number" >&2; exit 2; }; runs="$2"; shift 2 ;;
        --runs=*) runs="${1#--runs=}"; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) pytest_args+=("$1"); shift ;;
    esac
done
case "$runs" in ''|*[!0-9]*|0) echo "error: --runs must be a positive whole number, got '$runs'" >&2; exit 2 ;; esac

repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$repo" rev-parse HEAD)" || { echo "error: $repo is not a git checkout" >&2; exit 2; }
python="${PYTHON:-python}"
work="$(mktemp -d "${TMPDIR:-/tmp}/dynalize-suite-under-load.XXXXXX")"
busy=""
keep=""

cleanup() {
    if [ -n "$busy" ]; then
        kill "$busy" 2>/dev/null
        wait "$busy" 2>/dev/null
    fi
    if [ -n "$keep" ]; then
        rm -rf "$work/clone"  # the failed runs' logs stay
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

git clone -q --no-hardlinks "$repo" "$work/clone" && git -C "$work/clone" checkout -q --detach "$commit" \
    || { echo "error: could not clone $repo at $commit" >&2; exit 2; }

busy_cmd=("$python" -c "while True: pass")
if command -v taskset >/dev/null 2>&1; then
    busy_cmd=(taskset -c 0 "${busy_cmd[@]}")
fi
"${busy_cmd[@]}" &
busy=$!

shown="$(printf ' %q' "${pytest_args[@]}")"
[ ${#pytest_args[@]} -gt 0 ] || shown=""
echo "suite under load: ${runs} run(s) of \`python -m pytest -q${shown}\` on a fresh clone of" \
     "${commit:0:12} ($work/clone), $(nproc) CPU(s), one kept busy by pid $busy (${busy_cmd[*]})"
passed=0
failed=0
for i in $(seq 1 "$runs"); do
    log="$work/run_$i.log"
    start=$(date +%s)
    (cd "$work/clone" && DYNALIZE_LAUNCH_LOGS="$work/launch_logs" PYTHONPATH="$work/clone${PYTHONPATH:+:$PYTHONPATH}" \
        "$python" -m pytest -q "${pytest_args[@]}") >"$log" 2>&1
    status=$?
    closing="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)"
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
        echo "run $i/$runs: $closing (exit 0, $(( $(date +%s) - start )) s)"
    else
        failed=$((failed + 1))
        keep=1
        echo "run $i/$runs: $closing (exit $status, $(( $(date +%s) - start )) s; output: $log)"
    fi
done
echo "$passed passed runs, $failed failed runs"
[ "$failed" -eq 0 ]
