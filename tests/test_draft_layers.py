"""Drafters of more than one layer (DraftConfig.num_hidden_layers): the later layers are
plain pre-norm Llama layers over the previous layer's output, checked against
transformers' own LlamaDecoderLayer; each layer keeps its own TTT attention cache; the
export names them as vLLM loads them (layers.1 ...) and reads back identically."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_k2_tools.train.draft_model import DraftConfig, Eagle3Draft

pytestmark = pytest.mark.vllm_independent

H, V = 64, 96


def _cfg(layers: int) -> DraftConfig:
    return DraftConfig(
        hidden_size=H,
        target_hidden_size=H,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        draft_vocab_size=V,
        vocab_size=V,
        aux_layer_ids=[1, 2, 3],
        num_hidden_layers=layers,
    )


def _model(layers: int, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    model = Eagle3Draft(_cfg(layers), torch.randn(V, H), torch.zeros(V, dtype=torch.int64), torch.ones(V, dtype=bool))
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1, so a skipped norm shows
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def test_later_layers_are_llama_decoder_layers():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = _model(3)
    cfg = model.cfg.llama_config()
    cfg._attn_implementation = "eager"
    tokens = torch.randint(0, V, (2, 7))
    hidden = torch.randn(2, 7, H)
    pos = torch.arange(7).unsqueeze(0).expand(2, 7)
    got = model.step(tokens, hidden, pos, model.new_cache())

    one = _model(1)
    one.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("layers.")})
    h = one.step(tokens, hidden, pos, one.new_cache())  # layer 0 alone
    cos, sin = model.rotary(hidden, pos)
    mask = torch.full((7, 7), float("-inf")).triu(1)[None, None]
    for i in ("1", "2"):
        ref = LlamaDecoderLayer(cfg, layer_idx=int(i)).eval()
        ref.load_state_dict(model.layers[i].state_dict())
        out = ref(h, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
        h = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(got, h, rtol=1e-5, atol=1e-5)


def test_each_layer_attends_over_its_own_earlier_steps():
    model = _model(2)
    tokens = torch.randint(0, V, (1, 5))
    hidden = torch.randn(1, 5, H)
    pos = torch.arange(5)[None]
    cache = model.new_cache()
    h1 = model.step(tokens, hidden, pos, cache)
    model.step(tokens, h1, pos + 1, cache)
    assert [len(c) for c in cache] == [2, 2]
    k0_layer0, k0_layer1 = cache[0][0][0], cache[1][0][0]
    assert not torch.equal(k0_layer0, k0_layer1)
    assert cache[1][0][0].shape == cache[0][0][0].shape
    # layer 1's step-0 keys are its own projection of layer 0's step-0 output
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        embeds = torch.nn.functional.embedding(tokens, model.embed_tokens)
        cos, sin = model.rotary(hidden, pos)
        h0 = model.midlayer(embeds, hidden, cos, sin, [])
        layer = model.layers["1"]
        k = layer.self_attn.k_proj(layer.input_layernorm(h0)).view(1, 5, 2, 16).transpose(1, 2)
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
    torch.testing.assert_close(k0_layer1, k.repeat_interleave(2, dim=1))


@pytest.mark.parametrize("layout", ["speculators", "legacy"])
def test_two_layer_export_names_and_reads_back(tmp_path, layout, monkeypatch):
    from safetensors.torch import load_file, save_file

    from vllm_k2_tools.train.export import export, load_export

    model = _model(2)
    ck = tmp_path / "draft.safetensors"
    save_file({k: v.contiguous() for k, v in model.exported_state_dict().items()}, str(ck))
    target = tmp_path / "target"  # what export reads of a target: its config and embedding
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["KimiK25ForConditionalGeneration"],
                "text_config": {"num_hidden_layers": 4, "hidden_size": H, "vocab_size": V},
            }
        )
    )
    monkeypatch.setattr("vllm_k2_tools.train.target_weights.load_tensor", lambda t, name: model.embed_tokens)
    out = tmp_path / "export"
    export(str(ck), {"draft": model.cfg.to_dict()}, str(target), str(out), layout=layout, dtype="float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg.get("transformer_layer_config", cfg)["num_hidden_layers"] == 2
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["layers.1.self_attn.q_proj.weight"].shape == (4 * 16, H)  # hidden, not [embeds | hidden]
    assert ("layers.0.fc.weight" not in tensors) and ("layers.0.self_attn.q_proj.weight" in tensors) == (
        layout == "speculators"
    )
    back = load_export(str(out), str(target))
    assert back.cfg.num_hidden_layers == 2
    src, got = model.exported_state_dict(), back.exported_state_dict()
    assert set(got) == set(src) and all(torch.equal(got[k], src[k]) for k in src)


def test_layer_count_must_be_positive():
    with pytest.raises(ValueError, match="num_hidden_layers must be >= 1"):
        _cfg(0)
