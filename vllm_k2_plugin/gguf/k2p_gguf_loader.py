"""vLLM 0.16's GGUFModelLoader, taking over for deepseek2-architecture models.

Imported only inside the gguf-force-dequant patch (it imports vLLM). Other
architectures go through the stock loader unchanged (but may use force_dequant
only for deepseek2, where we own the name map)."""

from __future__ import annotations

from collections import Counter

import torch
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_default_torch_dtype

from .files import GGUFLoadError, discover_shards
from .loader import Options, audit_loaded, is_deepseek2, iter_weights, make_plan
from .names import deepseek2_name_map

logger = init_logger(__name__)


class K2GGUFModelLoader(GGUFModelLoader):
    def __init__(self, load_config: LoadConfig):
        # The stock loader refuses any extra config; ours reads force_dequant from it.
        BaseModelLoader.__init__(self, load_config)
        self.options = Options.parse(load_config.model_loader_extra_config)

    def _name_map(self, model_config):
        cfg = model_config.hf_config
        text = cfg.get_text_config()
        prefix = "language_model." if text is not cfg else ""
        return deepseek2_name_map(text, prefix=prefix)

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        if not is_deepseek2(model_config.hf_config):
            if self.options.force:
                raise GGUFLoadError("force_dequant is implemented for deepseek2-architecture GGUFs only")
            return super().load_model(vllm_config, model_config, prefix)
        first = self._prepare_weights(model_config)
        shards = discover_shards(first)
        names = self._name_map(model_config)
        plan = make_plan(shards, names, self.options, on_cpu=current_platform.is_cpu())
        if plan.tie_embeddings:
            model_config.hf_config.update({"tie_word_embeddings": True})
        vllm_config.quant_config.unquantized_modules.extend(plan.unquantized_modules())
        logger.info(
            "GGUF %s: %d shard(s), %d tensors, %d dequantized to %s at load",
            first,
            len(shards),
            len(plan.tensors),
            len(plan.dequant),
            model_config.dtype,
        )
        target_device = torch.device(vllm_config.device_config.device)
        counts: Counter = Counter()
        with set_default_torch_dtype(model_config.dtype):
            with target_device:
                model = initialize_model(vllm_config=vllm_config, prefix=prefix)
            loaded = model.load_weights(iter_weights(plan, model_config.dtype, counts))
            audit_loaded(model, loaded, counts, first)
            process_weights_after_loading(model, model_config, target_device)
        return model
