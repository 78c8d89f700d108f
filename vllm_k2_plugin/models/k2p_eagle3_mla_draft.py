"""EAGLE-3 drafters with DeepSeek MLA attention on vLLM 0.16 and 0.17 (``Eagle3DeepseekV2ForCausalLM``,
lightseekorg's Kimi K2.5 / K2.6 / K2.7 MLA drafters, vLLM's own K2.5 recipe), which vLLM builds
itself only from 0.18 on.

One decoder layer as those checkpoints hold it: the embedding and the ``fc`` state (the target's
three aux states through ``fc``, each normed first where the config sets ``fc_norm``) concatenated
into a 2 x hidden input, DeepSeek attention over it (``q_a_proj`` / ``kv_a_proj_with_mqa`` take
the 2 x hidden input; vLLM 0.16's attention classes have no input-size argument, so the layer is
built 2 x hidden wide and given an output projection back to hidden), a dense MLP, the final
norm (its output or its input handed to the next draft step, ``norm_output``), a draft
vocabulary head with ``d2t``. The attention is MLA (latent KV, the target's MLA backend and
cache) wherever the target runs MLA, and vLLM's DeepSeek MHA attention where it does not
(``VLLM_MLA_DISABLE=1``, vLLM 0.16's CPU engine): the drafter's KV cache is always the
target's kind.

It subclasses the plugin's Llama-layer drafter class because vLLM 0.16's proposer asserts
``isinstance(model, Eagle3LlamaForCausalLM)``; the target hidden size, ``d2t`` checks and
shared embeddings come from there.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.deepseek_v2 import DeepseekV2Attention, DeepseekV2MLAAttention, DeepseekV2MLP
from vllm.model_executor.models.utils import get_draft_quant_config, maybe_prefix

from .k2p_eagle3_draft import Eagle3KimiK25ForCausalLM

#: checkpoint name -> (vLLM parameter, shard) where vLLM fuses projections
_STACKED_MLP = ((".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))
_STACKED_MLA = ((".fused_qkv_a_proj", ".q_a_proj", 0), (".fused_qkv_a_proj", ".kv_a_proj_with_mqa", 1))


class _DraftLayer(nn.Module):
    def __init__(self, vllm_config, config, prefix: str, first: bool):
        super().__init__()
        self.first = first
        h = config.hidden_size
        quant = get_draft_quant_config(vllm_config)
        mla = bool(vllm_config.model_config.use_mla)
        attention = DeepseekV2MLAAttention if mla else DeepseekV2Attention
        self.self_attn = attention(
            vllm_config=vllm_config,
            config=config,
            hidden_size=2 * h if first else h,  # layer 0 reads [embedding, fc state]
            num_heads=config.num_attention_heads,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            q_lora_rank=getattr(config, "q_lora_rank", None),
            kv_lora_rank=config.kv_lora_rank,
            max_position_embeddings=getattr(config, "max_position_embeddings", 8192),
            cache_config=vllm_config.cache_config,
            quant_config=quant,
            prefix=f"{prefix}.self_attn",
        )
        if first:  # back to hidden, where the attention was built 2 x hidden wide
            o_proj = RowParallelLinear(
                config.num_attention_heads * config.v_head_dim,
                h,
                bias=False,
                quant_config=quant,
                prefix=f"{prefix}.self_attn.o_proj",
            )
            self.self_attn.o_proj = o_proj
            if mla:
                self.self_attn.mla_attn.o_proj = o_proj
        self.mlp = DeepseekV2MLP(
            hidden_size=h,
            intermediate_size=config.intermediate_size,
            hidden_act=config.hidden_act,
            quant_config=quant,
            prefix=f"{prefix}.mlp",
        )
        self.input_layernorm = RMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, eps=config.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(h, eps=config.rms_norm_eps)
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, positions, embeds, hidden_states, residual):
        if self.first:
            embeds = self.input_layernorm(embeds)
            if self.norm_before_residual:
                hidden_states = self.hidden_norm(hidden_states)
                residual = hidden_states
            else:
                residual = hidden_states
                hidden_states = self.hidden_norm(hidden_states)
            hidden_states = torch.cat([embeds, hidden_states], dim=-1)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states, llama_4_scaling=None)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class _DraftModel(nn.Module):
    def __init__(self, vllm_config, prefix: str, start_layer_id: int):
        super().__init__()
        self.config = config = vllm_config.speculative_config.draft_model_config.hf_config
        self.mla = bool(vllm_config.model_config.use_mla)
        self.use_aux_hidden_state = True  # what vLLM 0.16's proposer and our parent class read
        current = get_current_vllm_config()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "embed_tokens")
        )
        self.layers = nn.ModuleList(
            [
                _DraftLayer(current, config, maybe_prefix(prefix, f"layers.{i + start_layer_id}"), first=i == 0)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.num_aux = len(getattr(config, "eagle_aux_hidden_state_layer_ids", None) or ()) or 3
        self.fc = ReplicatedLinear(
            config.target_hidden_size * self.num_aux,
            config.hidden_size,
            bias=False,
            params_dtype=vllm_config.model_config.dtype,
            quant_config=get_draft_quant_config(vllm_config),
            prefix=maybe_prefix(prefix, "fc"),
            return_bias=False,
        )
        # EAGLE-3.1: each aux state normed before fc; the next step reads the normed output
        self.fc_norm = (
            nn.ModuleList([RMSNorm(config.target_hidden_size, eps=config.rms_norm_eps) for _ in range(self.num_aux)])
            if getattr(config, "fc_norm", False)
            else None
        )
        self.norm_output = bool(getattr(config, "norm_output", False))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, hidden_states, input_embeds=None):
        if input_embeds is None:
            input_embeds = self.embed_input_ids(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, input_embeds, hidden_states, residual)
        hidden_states, prenorm = self.norm(hidden_states, residual)
        return hidden_states, (hidden_states if self.norm_output else prenorm)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        stacked = _STACKED_MLP + (_STACKED_MLA if self.mla else ())
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.replace("midlayer.", "layers.0.")
            for param_name, shard_name, shard in stacked:
                if shard_name in name:
                    name = name.replace(shard_name, param_name)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                if name not in params:
                    from .eagle3_checks import DraftCheckError

                    raise DraftCheckError(f"MLA drafter: tensor {name!r} has no place in the drafter's layer")
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded


class Eagle3KimiK25MLAForCausalLM(Eagle3KimiK25ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        nn.Module.__init__(self)
        config = vllm_config.speculative_config.draft_model_config.hf_config
        if getattr(config, "target_hidden_size", None) is None:
            config.target_hidden_size = vllm_config.model_config.hf_text_config.hidden_size
        if getattr(config, "draft_vocab_size", None) is None:
            config.draft_vocab_size = config.vocab_size
        self.config = config
        self._k2_source = vllm_config.speculative_config.model
        target_layers = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
        config.target_layer_count = target_layers
        self.model = _DraftModel(vllm_config, prefix="model", start_layer_id=target_layers)
        self.lm_head = ParallelLMHead(
            config.draft_vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head")
        )
        self.logits_processor = LogitsProcessor(config.draft_vocab_size, scale=getattr(config, "logit_scale", 1.0))
        self.draft_id_to_target_id = nn.Parameter(
            torch.zeros(config.draft_vocab_size, dtype=torch.long), requires_grad=False
        )
        self.use_parallel_drafting = False

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.model.fc_norm is not None:
            chunks = hidden_states.chunk(self.model.num_aux, dim=-1)
            hidden_states = torch.cat([norm(c) for norm, c in zip(self.model.fc_norm, chunks, strict=True)], dim=-1)
        return self.model.fc(hidden_states)
