"""vLLM 0.16's GGUFModelLoader, taking over for deepseek2-architecture models.

Imported only inside the gguf-force-dequant patch (it imports vLLM). Other
architectures go through the stock loader unchanged (but may use force_dequant
only for deepseek2, where we own the name map)."""

from __future__ import annotations

from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

from .files import GGUFLoadError
from .loader import Options, is_deepseek2, load_deepseek2


class K2GGUFModelLoader(GGUFModelLoader):
    def __init__(self, load_config: LoadConfig):
        # The stock loader refuses any extra config; ours reads force_dequant from it.
        BaseModelLoader.__init__(self, load_config)
        self.options = Options.parse(load_config.model_loader_extra_config)

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        if not is_deepseek2(model_config.hf_config):
            if self.options.force:
                raise GGUFLoadError("force_dequant is implemented for deepseek2-architecture GGUFs only")
            return super().load_model(vllm_config, model_config, prefix)
        return load_deepseek2(self, vllm_config, model_config, prefix)
