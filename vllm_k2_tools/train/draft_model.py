"""The EAGLE-3 draft head as trained here: exactly the computation vLLM's
``Eagle3LlamaForCausalLM`` runs (0.16 ``llama_eagle3.py``), so an export loads and
behaves the same in the engine.

    g      = fc(concat(aux states of the target))               # 3*H_target -> H
    x      = concat(input_layernorm(embed(token)), hidden_norm(g))   # 2H
    a      = o_proj(attention(q,k,v = proj(x)))                 # RoPE, GQA
    r      = a + residual   (residual = g, or hidden_norm(g) with norm_before_residual)
    h_pre  = mlp(post_attention_layernorm(r)) + r               # fed back as the next step's g
    logits = lm_head(norm(h_pre))                               # over the draft vocabulary

With ``num_hidden_layers`` > 1, layers 1.. are plain pre-norm Llama layers over h_pre
(vLLM's later EAGLE-3 layers: hidden-size qkv input, no embedding), each with its own
attention cache; h_pre is the last layer's output.

With ``attention = "mla"`` the layer's attention is DeepSeek MLA over the same 2H input, as
vLLM's ``Eagle3DeepseekV2ForCausalLM`` (and the plugin's class on 0.16) run it: the layout
of lightseekorg's Kimi MLA drafters (one layer; the target's MLA dims; interleaved RoPE
over the rope dims).

Parameter names are the legacy EAGLE-3 checkpoint names (``fc``, ``midlayer.*``, ``norm``,
``lm_head``), so export is a rename-free save. The target's embedding and LM head are
frozen buffers: they are never exported (vLLM shares the target's embedding), and the
LM head rows of the draft vocabulary provide the distillation targets.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

ATTENTIONS = ("llama", "mla")


@dataclass
class DraftConfig:
    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    vocab_size: int  # the target's
    aux_layer_ids: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 4096
    norm_before_residual: bool = False
    num_hidden_layers: int = 1
    attention: str = "llama"  # "llama" (q/k/v projections) or "mla" (DeepSeek MLA, the fields below)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: dict | None = None  # mla: the target's (DeepSeek YaRN for K2.5), as its layers run RoPE

    def __post_init__(self):
        if self.num_hidden_layers < 1:
            raise ValueError(f"DraftConfig.num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"DraftConfig.attention must be one of {ATTENTIONS}, not {self.attention!r}")
        if self.attention == "mla":
            dims = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            bad = [f"{d}={getattr(self, d)}" for d in dims if getattr(self, d) < 1]
            if bad:
                raise ValueError(f"DraftConfig: attention 'mla' needs positive {', '.join(bad)}")
            if self.qk_rope_head_dim % 2:
                raise ValueError(f"DraftConfig.qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
            if self.num_hidden_layers != 1:  # the published MLA layout has one layer
                raise ValueError("DraftConfig: attention 'mla' is one draft layer (num_hidden_layers = 1)")
        if not self.aux_layer_ids:
            raise ValueError("DraftConfig.aux_layer_ids: the target layers the drafter reads must be explicit")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"DraftConfig: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def to_dict(self) -> dict:
        return asdict(self)

    def llama_config(self):
        """The HF LlamaConfig of the draft layer (for transformers' RoPE/MLP/norm modules)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            mlp_bias=False,
            attention_bias=False,
        )

    @classmethod
    def kimi_k25(cls, draft_vocab_size: int = 32_000, aux_layer_ids=(2, 30, 58)) -> DraftConfig:
        """SpecForge / TorchSpec's Kimi-K2.5 draft geometry (research §3.2)."""
        return cls(
            hidden_size=7168,
            target_hidden_size=7168,
            num_attention_heads=64,
            num_key_value_heads=64,
            head_dim=128,
            intermediate_size=18432,
            draft_vocab_size=draft_vocab_size,
            vocab_size=163_840,
            aux_layer_ids=list(aux_layer_ids),
            max_position_embeddings=131_072,
        )


class DraftAttention(nn.Module):
    """Attention of one TTT step: causal over step-0 keys, plus the query's own position
    in every earlier step (what the draft's KV cache holds at inference when the chain
    so far was accepted). Written out because the mask is not a plain causal one."""

    def __init__(self, cfg: DraftConfig, in_size: int):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(in_size, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(in_size, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(in_size, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)

    def forward(self, x, cos, sin, cache: list[tuple[torch.Tensor, torch.Tensor]]):
        """x [B,T,in_size]; cos/sin for this step's positions; cache: (k, v) of earlier steps,
        appended to. Returns [B,T,H]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        cache.append((k, v))
        out = ttt_attention(q, cache, cfg.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class DraftMLAAttention(nn.Module):
    """DeepSeek MLA attention of one TTT step, computed the expanded way (per-head keys and
    values from the normed latent through kv_b_proj; one RoPE key shared by all heads), the
    same function vLLM's absorbed MLA decode computes. Values are zero-padded to the query
    head size so the fused TTT attention (equal head sizes) serves both layouts."""

    def __init__(self, cfg: DraftConfig, in_size: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.cfg = cfg
        heads, qk = cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(in_size, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = LlamaRMSNorm(cfg.q_lora_rank, eps=cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, heads * qk, bias=False)
        else:
            self.q_proj = nn.Linear(in_size, heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(in_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = LlamaRMSNorm(cfg.kv_lora_rank, eps=cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * cfg.v_head_dim, cfg.hidden_size, bias=False)
        self.scale = qk**-0.5
        rs = cfg.rope_scaling or {}
        if rs.get("mscale_all_dim"):  # DeepSeek YaRN: the softmax scale grows with the context factor
            self.scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2

    def forward(self, x, cos, sin, cache: list[tuple[torch.Tensor, torch.Tensor]]):
        """x [B,T,in_size]; cos/sin [B,1,T,rope/2] (interleaved RoPE); cache as DraftAttention's."""
        b, t, _ = x.shape
        cfg = self.cfg
        heads, nope, rope, vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if cfg.q_lora_rank else self.q_proj(x)
        q = q.view(b, t, heads, nope + rope).transpose(1, 2)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, t, heads, nope + vd).transpose(1, 2)
        k_nope, v = kv.split([nope, vd], dim=-1)
        q_pe = rotate_interleaved(q[..., nope:], cos, sin)
        k_pe = rotate_interleaved(k_pe.unsqueeze(1), cos, sin).expand(b, heads, t, rope)
        q = torch.cat([q[..., :nope], q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe], dim=-1)
        v = nn.functional.pad(v, (0, nope + rope - vd)) if nope + rope > vd else v
        cache.append((k, v))
        out = ttt_attention(q, cache, self.scale)[..., :vd]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, heads * vd))


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepSeek's YaRN attention magnitude (its reference code; vLLM's ``yarn_get_mscale``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_rotary(cfg: DraftConfig) -> nn.Module:
    """transformers' DeepSeek-V3 rotary embedding over the rope dims (default or YaRN, as the
    target's config says): cos/sin with YaRN's magnitude already applied."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    config = DeepseekV3Config(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        v_head_dim=cfg.v_head_dim,
        rope_theta=cfg.rope_theta,
        rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    return DeepseekV3RotaryEmbedding(config=config)


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs (x[2i], x[2i+1]): DeepSeek's layout (vLLM's is_neox_style=False)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


# Which attention implementation ``ttt_attention`` uses: "auto" (fused on CUDA in fp16/bf16,
# the eager reference otherwise), "reference" or "fused". The eager reference is the
# definition; tests check the fused path against it (tests/test_train_step_gpu.py).
ATTENTION_IMPL = "auto"


def ttt_attention(q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """softmax over [causal step-0 scores | diagonal scores of steps 1..k] (fp32 softmax).

    Dispatches to ``ttt_attention_reference`` or the fused flash-attention path
    (``ttt_attention_fused``) according to ``ATTENTION_IMPL``; both compute the same function."""
    impl = ATTENTION_IMPL
    if impl == "auto":
        impl = "fused" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "reference"
    if impl == "fused":
        return ttt_attention_fused(q, cache, scale)
    if impl != "reference":
        raise ValueError(f"draft_model.ATTENTION_IMPL must be auto|reference|fused, not {impl!r}")
    return ttt_attention_reference(q, cache, scale)


def ttt_attention_reference(
    q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float
) -> torch.Tensor:
    """The definition, written eagerly: materialises [B,h,T,T+k] scores."""
    k0, v0 = cache[0]
    t = q.shape[-2]
    s0 = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [B,h,T,T]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [((q * kj).sum(-1) * scale).unsqueeze(-1) for kj, _ in cache[1:]]  # [B,h,T,1] each
    scores = torch.cat([s0, *diag], dim=-1).float().softmax(-1).to(q.dtype)
    out = torch.matmul(scores[..., :t], v0)
    for j, (_, vj) in enumerate(cache[1:]):
        out = out + scores[..., t + j : t + j + 1] * vj
    return out


def ttt_attention_fused(q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """Same function as the reference without the [T,T] score matrix: the causal step-0 block
    runs through the flash-attention kernel (which also returns its log-sum-exp), the k
    diagonal scores are merged into that softmax by log-sum-exp, and the backward runs the
    flash backward kernel with the *merged* output and log-sum-exp (which makes its
    gradients those of the full softmax) plus the diagonal terms in closed form."""
    flat = [x for kv in cache[1:] for x in kv]
    return _TTTAttention.apply(scale, q, cache[0][0], cache[0][1], *flat)


def _flash_fwd(q, k, v, scale):
    """Causal attention -> (out [B,h,T,d], lse [B,h,T] fp32, state for the backward)."""
    if q.is_cuda:
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
        return r[0], r[1], r[2:8]
    r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return r[0], r[1], None


def _flash_bwd(do, q, k, v, out, lse, state, scale):
    if q.is_cuda:
        cq, ck, mq, mk, seed, offset = state
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed, offset, scale=scale
        )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, q, k, v, out, lse, 0.0, True, scale=scale
    )


class _TTTAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scale, q, k0, v0, *kv):
        t = q.shape[-2]
        out0, lse0_raw, state = _flash_fwd(q, k0, v0, scale)
        lse0 = lse0_raw[..., :t].float()
        ks, vs = kv[0::2], kv[1::2]
        if ks:
            s = torch.stack([(q * kj).sum(-1).float() * scale for kj in ks])  # [k,B,h,T]
            lse = torch.logaddexp(lse0, torch.logsumexp(s, dim=0))
            p = torch.exp(s - lse)  # weights of the diagonal keys
            out = out0.float() * torch.exp(lse0 - lse).unsqueeze(-1)
            for j, vj in enumerate(vs):
                out = out + p[j].unsqueeze(-1) * vj.float()
            out = out.to(q.dtype)
        else:
            lse, p, out = lse0, None, out0
        lse_full = lse0_raw.clone()
        lse_full[..., :t] = lse.to(lse_full.dtype)
        ctx.scale, ctx.state, ctx.n = scale, state, len(ks)
        ctx.save_for_backward(q, k0, v0, out, lse_full, *([p] if p is not None else []), *kv)
        return out

    @staticmethod
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        q, k0, v0, out, lse_full = saved[:5]
        n, scale = ctx.n, ctx.scale
        dout = dout.contiguous() if dout.stride(-1) != 1 else dout
        dq, dk0, dv0 = _flash_bwd(dout, q, k0, v0, out, lse_full, ctx.state, scale)
        grads = []
        if n:
            p = saved[5]
            kv = saved[6:]
            do32 = dout.float()
            delta = (do32 * out.float()).sum(-1)  # D = rowsum(dO * O), as the flash backward uses
            dq = dq.float()
            for j in range(n):
                kj, vj = kv[2 * j], kv[2 * j + 1]
                dvj = p[j].unsqueeze(-1) * do32
                ds = p[j] * ((do32 * vj.float()).sum(-1) - delta) * scale
                dq = dq + ds.unsqueeze(-1) * kj.float()
                dkj = ds.unsqueeze(-1) * q.float()
                grads += [dkj.to(kj.dtype), dvj.to(vj.dtype)]
            dq = dq.to(q.dtype)
        return (None, dq, dk0, dv0, *grads)


class DraftLayer(nn.Module):
    """Layer 0 (``first``): attention over [embedding | hidden]; later layers: over the
    previous layer's output, as a plain pre-norm Llama layer."""

    def __init__(self, cfg: DraftConfig, first: bool = True):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.first = first
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        if first:
            self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        attention = DraftMLAAttention if cfg.attention == "mla" else DraftAttention
        self.self_attn = attention(cfg, (2 if first else 1) * cfg.hidden_size)
        self.mlp = LlamaMLP(cfg.llama_config())

    def forward(self, embeds, hidden, cos, sin, cache):
        if self.first:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        else:
            residual, x = hidden, self.input_layernorm(hidden)
        r = self.self_attn(x, cos, sin, cache) + residual
        return self.mlp(self.post_attention_layernorm(r)) + r


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: DraftConfig, embed_weight: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.cfg = cfg
        if embed_weight.shape != (cfg.vocab_size, cfg.hidden_size):
            raise ValueError(
                f"target embedding has shape {tuple(embed_weight.shape)}, the draft config expects "
                f"({cfg.vocab_size}, {cfg.hidden_size})"
            )
        if d2t.shape != (cfg.draft_vocab_size,) or t2d.shape != (cfg.vocab_size,):
            raise ValueError(f"d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not match the draft config")
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        # later layers keep vLLM's checkpoint names, layers.1 ... (layer 0 is midlayer)
        self.layers = nn.ModuleDict({str(i): DraftLayer(cfg, first=False) for i in range(1, cfg.num_hidden_layers)})
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(config=cfg.llama_config())
        if cfg.attention == "mla":  # RoPE over the rope dims only, interleaved; not exported
            self.mla_rotary = mla_rotary(cfg)
        # Frozen target pieces and the vocabulary map: buffers, not parameters.
        self.register_buffer("embed_tokens", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("d2t", d2t.to(torch.int64))
        self.register_buffer("t2d", t2d.to(torch.bool))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def exported_state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: trainable weights + d2t/t2d (no embedding, no rotary cache)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("rotary.", "mla_rotary."))}

    def load_exported(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Load what exported_state_dict() wrote, strictly: every key it writes, no other."""
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith(("rotary.", "mla_rotary."))]  # never saved: recomputed
        if missing or unexpected:
            raise ValueError(f"{source}: does not match the draft (missing {missing}, unexpected {unexpected})")

    def new_cache(self) -> list[list]:
        """The attention caches of a TTT unroll: one list of (k, v) per layer."""
        return [[] for _ in range(self.cfg.num_hidden_layers)]

    def step(self, tokens, hidden, positions, cache):
        """One draft step over all positions: returns the pre-norm output [B,T,H].
        ``cache``: ``new_cache()``, appended to."""
        embeds = nn.functional.embedding(tokens, self.embed_tokens).to(hidden.dtype)
        if self.cfg.attention == "mla":  # [B,T,rope] = both halves the same angles -> [B,1,T,rope/2]
            cos, sin = (
                t[..., : self.cfg.qk_rope_head_dim // 2].unsqueeze(1) for t in self.mla_rotary(hidden, positions)
            )
        else:
            cos, sin = self.rotary(hidden, positions)
        h = self.midlayer(embeds, hidden, cos, sin, cache[0])
        for i, layer in enumerate(self.layers.values(), start=1):
            h = layer(None, h, cos, sin, cache[i])
        return h

    def forward(self, batch, verifier_w: torch.Tensor, steps: int, decay: float = 0.8):
        """The training objective (so DDP's wrapper sees the whole step): see ttt.ttt_loss."""
        from .ttt import ttt_loss

        return ttt_loss(self, batch, verifier_w, steps, decay)

    def logits(self, h_pre: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h_pre))
