"""Regeneration against a server that fails and truncates: retries, per-chat failures
reported, truncated answers left out and counted, and an interrupted run resumed without
asking for a finished chat again. The server is a small OpenAI-style stand-in on
127.0.0.1 (what is tested is our client side; the real vLLM server path runs in the
training e2e test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vllm_k2_tools.fixtures.trained_target import DATA_DIR
from vllm_k2_tools.train.prepare import prepare

pytestmark = pytest.mark.vllm_independent

REPO = Path(__file__).resolve().parent.parent


class FakeServer:
    """Every 10th request: HTTP 503 (transient). "FAILALWAYS" in the prompt: HTTP 500 every
    time. "LONG": finish_reason "length". Optional delay per request."""

    def __init__(self, delay: float = 0.0):
        self.requests: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "fake-target"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                with outer.lock:
                    outer.requests.append(prompt)
                    n = len(outer.requests)
                time.sleep(delay)
                if "FAILALWAYS" in prompt or n % 10 == 0:
                    return self._send(500 if "FAILALWAYS" in prompt else 503, {"error": "injected"})
                finish = "length" if "LONG" in prompt else "stop"
                msg = {"role": "assistant", "content": f"answer to {prompt}"}
                self._send(200, {"choices": [{"message": msg, "finish_reason": finish}]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def _chats(path: Path, n: int, special: dict[int, str] | None = None) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            tag = (special or {}).get(i, "")
            msgs = [{"role": "user", "content": f"chat {i} {tag}".strip()}, {"role": "assistant", "content": "old"}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    return path


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def test_failures_retried_reported_and_truncated_answers_left_out(server, tmp_path):
    data = _chats(tmp_path / "c.jsonl", 40, {3: "FAILALWAYS", 17: "FAILALWAYS", 5: "LONG", 6: "LONG", 30: "LONG"})
    meta = prepare(
        DATA_DIR, [str(data)], str(tmp_path / "out"), max_len=256, regenerate_url=server.url, concurrency=4, retries=4
    )
    assert meta["num_samples"] == 40 - 2 - 3
    assert sorted(int(f["id"].split(":")[-1]) for f in meta["regeneration_failures"]) == [4, 18]  # 1-based lines
    assert all("HTTP 500" in f["error"] and "5 attempt(s)" in f["error"] for f in meta["regeneration_failures"])
    assert meta["regeneration_truncated_left_out"] == 3
    chats = [json.loads(x) for x in (tmp_path / "out" / "chats.jsonl").read_text().splitlines()]
    assert all(c["messages"][1]["content"] == "answer to " + c["messages"][0]["content"] for c in chats)
    assert not any("LONG" in c["messages"][0]["content"] for c in chats)
    transient = sum(1 for i, _ in enumerate(server.requests, 1) if i % 10 == 0)
    assert transient >= 3  # and yet every other chat came back: they were retried
    assert not (tmp_path / "out" / "regenerated.partial.jsonl").exists()


def test_interrupted_regeneration_resumes_without_asking_again(tmp_path):
    slow = FakeServer(delay=0.15)
    try:
        data = _chats(tmp_path / "c.jsonl", 30)
        out = tmp_path / "out"
        code = (
            f"from vllm_k2_tools.train.prepare import prepare; prepare({DATA_DIR!r}, [{str(data)!r}], "
            f"{str(out)!r}, max_len=256, regenerate_url={slow.url!r}, concurrency=1)"
        )
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        journal = out / "regenerated.partial.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and (not journal.exists() or len(journal.read_text().splitlines()) < 8):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kept = {json.loads(x)["messages"][0]["content"] for x in journal.read_text().splitlines() if x.endswith("}")}
        assert 8 <= len(kept) < 30
        first_run = len(slow.requests)
        meta = prepare(DATA_DIR, [str(data)], str(out), max_len=256, regenerate_url=slow.url, concurrency=4)
        asked_again = slow.requests[first_run:]
        assert not kept & set(asked_again), "a chat finished before the kill was requested again"
        assert meta["num_samples"] == 30
        chats = [json.loads(x)["messages"][0]["content"] for x in (out / "chats.jsonl").read_text().splitlines()]
        assert sorted(chats) == sorted(f"chat {i}" for i in range(30))
    finally:
        slow.close()
