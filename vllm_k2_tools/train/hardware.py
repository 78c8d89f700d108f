"""GPU specs and Kimi-K2.5 constants for the hero-run planner (``plan.py``).

Datasheet figures are leads, not measurements: the planner only uses them as RATIOS to the
H200 the training step was measured on (bf16 dense TFLOP/s for the matmul part, memory
bandwidth for the rest). ``allreduce_gbps`` is an NCCL all-reduce bus bandwidth assumption
(nccl-tests' "busbw"), used for the data-parallel gradient all-reduce and the
tensor-parallel all-reduces of extraction; override it with ``--interconnect-gbps``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    bf16_dense_tflops: float  # tensor-core bf16, fp32 accumulate, no sparsity
    mem_bw_tbs: float  # TB/s
    mem_gb: float  # GB per GPU
    allreduce_gbps: float  # assumed NCCL all-reduce bus bandwidth, GB/s
    interconnect: str
    source: str


H200_KEY = "h200"

GPUS: dict[str, GPUSpec] = {
    g.key: g
    for g in (
        GPUSpec(
            "rtx-pro-6000",
            "NVIDIA RTX PRO 6000 Blackwell (PCIe, 600 W)",
            503.8,
            1.792,
            96,
            25.0,
            "PCIe 5.0 x16, no NVLink",
            "NVIDIA RTX Blackwell datasheet: 503.8 TFLOP/s bf16 tensor dense (1007.6 sparse), 96 GB GDDR7, "
            "1,792 GB/s; all-reduce busbw 25 GB/s is an assumption for 8 GPUs on PCIe 5.0",
        ),
        GPUSpec(
            "h200",
            "NVIDIA H200 SXM",
            989.0,
            4.8,
            141,
            360.0,
            "NVLink 4 (900 GB/s per GPU), NVSwitch",
            "NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense (1,979 sparse), 141 GB HBM3e, 4.8 TB/s; "
            "all-reduce busbw 360 GB/s assumed for 8 GPUs (2 GPUs are measured by benchmarks/train_step.py)",
        ),
        GPUSpec(
            "b200",
            "NVIDIA B200 (HGX/DGX B200, NVL8)",
            2250.0,
            8.0,
            180,
            650.0,
            "NVLink 5 (1.8 TB/s per GPU), NVSwitch",
            "NVIDIA HGX B200: 2.25 PFLOP/s bf16 dense per GPU (36 PFLOP/s sparse per 8), 180 GB HBM3e "
            "(DGX B200 1,440 GB / 8), 8 TB/s; all-reduce busbw 650 GB/s assumed",
        ),
        GPUSpec(
            "b300",
            "NVIDIA B300 Blackwell Ultra (HGX B300, NVL8)",
            2250.0,
            8.0,
            288,
            650.0,
            "NVLink 5 (1.8 TB/s per GPU), NVSwitch",
            "NVIDIA HGX B300: bf16 dense as B200 (Blackwell Ultra raised FP4, not bf16), 288 GB HBM3e, 8 TB/s; "
            "all-reduce busbw 650 GB/s assumed",
        ),
    )
}


@dataclass(frozen=True)
class K25Constants:
    active_params: float = 32e9  # "32B activated parameters" (K2.5 model card)
    layers: int = 61
    hidden: int = 7168
    heads: int = 64
    qk_head_dim: int = 192  # MLA: 128 nope + 64 rope
    v_head_dim: int = 128
    target_gb: float = 595.0  # native INT4 checkpoint (routed experts INT4, rest bf16), approximate
    bytes_per_token_offline: int = 57_344  # 3 aux + final hidden states, 7168 x bf16 each


K25 = K25Constants()


@dataclass(frozen=True)
class DraftDims:
    """``DraftConfig.kimi_k25(draft_vocab_size=32000)`` without importing torch
    (tests/test_train_plan.py checks they agree)."""

    hidden: int = 7168
    target_hidden: int = 7168
    num_aux: int = 3
    heads: int = 64
    kv_heads: int = 64
    head_dim: int = 128
    intermediate: int = 18432
    draft_vocab: int = 32_000
    target_vocab: int = 163_840

    @classmethod
    def from_config(cls, cfg) -> DraftDims:
        """The dims of a ``train.draft_model.DraftConfig`` (any size)."""
        return cls(
            hidden=cfg.hidden_size,
            target_hidden=cfg.target_hidden_size,
            num_aux=cfg.num_aux,
            heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            intermediate=cfg.intermediate_size,
            draft_vocab=cfg.draft_vocab_size,
            target_vocab=cfg.vocab_size,
        )

    @property
    def trainable_params(self) -> int:
        """fc + q/k/v/o + MLP + 4 RMSNorms + LM head (the frozen embedding is a buffer)."""
        h, hd = self.hidden, self.head_dim
        attn = 2 * h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h
        return self.num_aux * self.target_hidden * h + attn + 3 * h * self.intermediate + 4 * h + h * self.draft_vocab


K25_DRAFT = DraftDims()
