"""`vllm-k2 gguf check` (no engine): a GGUF written the way llama.cpp does passes; one whose
attn_k_b was not transposed, or whose config is not an MLA model, fails with one line
naming the file and tensor (or field)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_k2_plugin.cli import main

pytest.importorskip("gguf")  # gguf-py ships with vLLM <= 0.23 (the 0.16 engine)


@pytest.fixture(scope="module")
def llamacpp_gguf(text_model, tmp_path_factory):
    from .gguf_llamacpp_writer import convert

    return convert(text_model, str(tmp_path_factory.mktemp("gguf") / "llamacpp.gguf"))


def _check(capsys, *args):
    code = main(["gguf", "check", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_llamacpp_layout_gguf_passes(llamacpp_gguf, text_model, capsys):
    code, out, _ = _check(capsys, llamacpp_gguf, "--hf-config-path", text_model, "--json")
    s = json.loads(out)
    assert code == 0 and s["mla_layout"] == "attn_k_b + attn_v_b" and s["dequantized_at_load"] == 16, s


def test_k_b_not_transposed_fails_naming_the_tensor(text_model, tmp_path, capsys):
    from vllm_k2_tools.fixtures.gguf_writer import write_gguf

    # [heads, nope, kv_lora]: k_b as HF slices it, without llama.cpp's transpose
    wrong = np.zeros((4, 128, 512), np.float32)
    paths = write_gguf(
        text_model,
        str(tmp_path / "wrong.gguf"),
        drop=("blk.3.attn_k_b.weight",),
        extra={"blk.3.attn_k_b.weight": wrong},
    )
    code, _, err = _check(capsys, paths[0], "--hf-config-path", text_model)
    assert code == 1
    assert err.strip() == (
        f"FAIL {paths[0]}: tensor 'blk.3.attn_k_b.weight' has shape [4, 128, 512], the config "
        f"({text_model}/config.json) needs [4, 512, 128] (attn_k_b: llama.cpp's layout, see "
        "vllm_k2_plugin/gguf/mla_layout.py)"
    )


def test_not_an_mla_config_fails_naming_the_field(llamacpp_gguf, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    code, _, err = _check(capsys, llamacpp_gguf, "--hf-config-path", str(tmp_path))
    assert code == 1 and f"{tmp_path}/config.json: model_type 'llama' is not a deepseek2 architecture" in err
