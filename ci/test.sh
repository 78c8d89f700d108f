#!/usr/bin/env bash
# The test command (README, .ci/run): build both real vLLM engines (cached) and run
# the whole suite once per engine; then the vLLM 0.34 import check (GPU wheel, no engine:
# tests/test_vllm034_import.py and tests/test_patch_files_034.py only). Exit code:
# non-zero if any engine's run failed; pytest's "no tests collected" (5) counts as
# failure, never as green.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"
ENGINES=${VLLM_K2_ENGINES:-"vllm016 latest vllm034"}
status=0
summary=()
# The training pipeline's end-to-end test spans both engines (extraction on 0.16,
# serving on the latest): one shared run directory for this invocation.
if [[ -z "${VLLM_K2_E2E_DIR:-}" ]]; then
  export VLLM_K2_E2E_DIR=$(mktemp -d -t vllm-k2-e2e-XXXX)
  trap 'rm -rf "$VLLM_K2_E2E_DIR"' EXIT
fi
for engine in $ENGINES; do
  t0=$(date +%s)
  venv=$(bash ci/engine.sh "$engine") || { echo "engine $engine failed to build" >&2; exit 1; }
  [[ "$engine" == vllm016 ]] && export VLLM_K2_VENV_VLLM016="$venv"
  t1=$(date +%s)
  version=$("$venv/bin/python" -c 'from vllm_k2_plugin.patching.versions import vllm_version_string as v; print(v())')
  echo "=== tests on engine $engine ($version), engine ready in $((t1 - t0)) s" \
       "(venv built in $(cat "$venv/.install-seconds" 2>/dev/null || echo '?') s, $(cat "$venv/.install-size" 2>/dev/null || echo '?'))"
  # The 0.34 venv can import vLLM, not start it: only its import check and its patch
  # series (applied to a copy, probes flipped) run there.
  tests=("$@")
  [[ "$engine" == vllm034 ]] && tests=(tests/test_vllm034_import.py tests/test_patch_files_034.py)
  # A private basetemp: pytest prunes old numbered dirs under /tmp/pytest-of-$USER, which
  # would delete another concurrent session's fixtures.
  basetemp=$(mktemp -d -t "vllm-k2-pytest-$engine-XXXX")
  "$venv/bin/python" -m pytest --basetemp "$basetemp" "${tests[@]}"
  rc=$?
  rm -rf "$basetemp"
  t2=$(date +%s)
  if [[ $rc -eq 5 ]]; then
    echo "engine $engine: pytest collected no tests - treated as a failure" >&2
    rc=1
  fi
  summary+=("$engine: pytest exit $rc, engine $((t1 - t0)) s, tests $((t2 - t1)) s")
  [[ $rc -ne 0 ]] && status=1
done
printf '%s\n' "${summary[@]}"
exit $status
