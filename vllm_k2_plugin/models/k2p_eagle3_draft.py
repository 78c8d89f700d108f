"""The Kimi-K2.5 EAGLE-3 speculator class for vLLM 0.16 (``Eagle3KimiK25ForCausalLM``).

A Llama-layer EAGLE-3 head, as vLLM 0.16's proposer requires (it asserts
``isinstance(model, Eagle3LlamaForCausalLM)``), that additionally:

* takes the target's hidden size from the target's ``text_config`` when the draft
  config has no ``target_hidden_size`` (K2.5's hidden size sits in text_config);
* refuses a ``d2t`` that would scatter draft logits onto wrong target ids, naming
  the checkpoint and tensor, instead of serving garbage;
* leaves ``embed_tokens`` out when the checkpoint has none, so the proposer shares
  the target's (2.35 GB for K2.5) instead of allocating a copy.

The basename is unique on purpose: vLLM caches model inspection by the basename of
the module inside its own models/ folder.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

from .eagle3_checks import DraftSummary, check_d2t


class Eagle3KimiK25ForCausalLM(Eagle3LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        draft_cfg = vllm_config.speculative_config.draft_model_config.hf_config
        target_text = vllm_config.model_config.hf_text_config
        if getattr(draft_cfg, "target_hidden_size", None) is None:
            draft_cfg.target_hidden_size = target_text.hidden_size
        self._k2_source = vllm_config.speculative_config.model
        super().__init__(vllm_config=vllm_config, prefix=prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        summary = DraftSummary(
            layout="?",
            hidden_size=self.config.hidden_size,
            vocab_size=self.config.vocab_size,
            draft_vocab_size=self.config.draft_vocab_size,
            target_hidden_size=self.config.target_hidden_size,
            target_hidden_from="config",
            aux_layer_ids=None,
            aux_ids_from="",
        )
        has_d2t = False

        def checked():
            nonlocal has_d2t
            for name, tensor in weights:
                if name.endswith("d2t"):
                    has_d2t = True
                    check_d2t(self._k2_source, name, summary, tensor=tensor)
                yield name, tensor

        loaded = super().load_weights(checked())
        if not has_d2t and self.config.draft_vocab_size != self.config.vocab_size:
            from .eagle3_checks import DraftCheckError

            raise DraftCheckError(
                f"{self._k2_source}: tensor 'd2t' is missing but draft_vocab_size "
                f"({self.config.draft_vocab_size}) < vocab_size ({self.config.vocab_size})"
            )
        return loaded
