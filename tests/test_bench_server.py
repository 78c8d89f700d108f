"""`vllm_server`: a server that cannot start fails with its log's path and its root cause,
not only the tail of a traceback (vLLM prints the cause first and echoes it many lines
later from the engine and API processes)."""

from __future__ import annotations

import pytest

from vllm_k2_tools.bench.server import ServerFailed, first_error, vllm_server


@pytest.mark.vllm_latest
def test_a_server_that_cannot_start_names_its_log_and_first_error(tmp_path):
    model = tmp_path / "not-a-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ServerFailed) as failed:
        with vllm_server(str(model), ["--max-model-len", "64"], timeout_s=300):
            pass
    message = str(failed.value)
    log = message.split("(log: ", 1)[1].split(")", 1)[0]
    with open(log) as f:  # kept: the server failed
        cause = first_error(f.read())
    assert cause is not None and f"first error: {cause}" in message
    assert "ModelConfig" in cause  # vLLM refuses the config: the cause, not the engine's echo


def test_first_error_skips_warnings_that_quote_an_error():
    log = (
        "WARNING 12-01 [system_utils.py:255] failed with error. This can cause `OSError: [Errno 24] Too many`\n"
        "(VllmWorker-0 pid=1) ERROR 12-01 [multiproc_executor.py:953] ValueError: Available memory is less\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert first_error(log) == "ValueError: Available memory is less"
    assert first_error("all good\n") is None
