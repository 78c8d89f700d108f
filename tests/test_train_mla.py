"""The trainer's MLA drafter layer (``attention = "mla"``) against transformers' own DeepSeek-V3
attention: with the same weights, the first TTT step (plain causal attention) gives the same
output, so the trained layer computes what a DeepSeek MLA layer computes. That the exported
drafter also drafts in vLLM what the offline evaluation predicts is tests/test_train_e2e.py's."""

from __future__ import annotations

import pytest
import torch

from vllm_k2_tools.fixtures.build import K25_ROPE_SCALING as K25_YARN
from vllm_k2_tools.train.draft_model import DraftConfig, DraftMLAAttention, mla_rotary, rotate_interleaved

pytestmark = pytest.mark.vllm_independent


def _configs(q_lora_rank, rope_scaling):
    from transformers import DeepseekV3Config

    dims = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
    ours = DraftConfig(
        hidden_size=48,
        target_hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=12,
        intermediate_size=64,
        draft_vocab_size=10,
        vocab_size=20,
        aux_layer_ids=[1, 2, 3],
        rope_theta=50000.0,
        max_position_embeddings=262144,
        attention="mla",
        q_lora_rank=q_lora_rank,
        rope_scaling=rope_scaling,
        **dims,
    )
    theirs = DeepseekV3Config(
        hidden_size=48,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora_rank,
        rope_theta=50000.0,
        rope_scaling=dict(rope_scaling) if rope_scaling else None,
        max_position_embeddings=262144,
        rope_interleave=True,  # DeepSeek's checkpoint layout (vLLM: is_neox_style=False)
        rms_norm_eps=1e-6,
        attention_bias=False,
        **dims,
    )
    theirs._attn_implementation = "eager"
    return ours, theirs


@pytest.mark.parametrize(
    ("q_lora_rank", "rope_scaling"), [(24, None), (None, None), (24, K25_YARN)], ids=["q-lora", "no-q-lora", "k25-yarn"]
)
def test_mla_layer_equals_transformers_deepseek_v3_attention(q_lora_rank, rope_scaling):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    ours_cfg, theirs_cfg = _configs(q_lora_rank, rope_scaling)
    torch.manual_seed(0)
    theirs = DeepseekV3Attention(theirs_cfg, layer_idx=0).float()
    for p in theirs.parameters():  # the norms' weights too: a weight left at 1 hides a swap
        torch.nn.init.normal_(p, std=0.3)
    ours = DraftMLAAttention(ours_cfg, in_size=48).float()
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert not missing and not unexpected, (missing, unexpected)  # same tensor names as the checkpoints

    b, t = 2, 7
    x = torch.randn(b, t, 48)
    positions = torch.arange(5000, 5000 + t).unsqueeze(0).expand(b, t)  # past YaRN's original 4096
    cos_t, sin_t = DeepseekV3RotaryEmbedding(theirs_cfg)(x, positions)
    mask = torch.full((t, t), float("-inf")).triu(1).expand(b, 1, t, t)
    want, _ = theirs(x, (cos_t, sin_t), mask)

    half = ours_cfg.qk_rope_head_dim // 2
    cos, sin = (t[..., :half].unsqueeze(1) for t in mla_rotary(ours_cfg)(x, positions))
    got = ours(x, cos, sin, cache=[])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_rope_pairs_are_interleaved():
    """(x0, x1) rotate together: DeepSeek's layout, not the halves (x0, x_{d/2}) of NeoX."""
    x = torch.tensor([1.0, 0.0, 0.0, 0.0])
    angle = torch.tensor([torch.pi / 2, 0.0])
    out = rotate_interleaved(x, angle.cos(), angle.sin())
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0, 0.0, 0.0]), atol=1e-6, rtol=0)
