"""vLLM 0.16's GGUFModelLoader, taking over for deepseek2-architecture models.

Imported only inside the gguf-force-dequant patch (it imports vLLM). Other
architectures go through the stock loader unchanged (but may use force_dequant
only for deepseek2, where we own the name map)."""

from __future__ import annotations

import dataclasses
import os

from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.gguf_loader import GGUFModelLoader

from .files import GGUFLoadError
from .loader import Options, is_deepseek2, load_deepseek2


def is_gguf_path(path: str) -> bool:
    """A GGUF file, or a folder holding one (how vLLM's GGUF support is pointed at a model)."""
    if path.endswith(".gguf"):
        return True
    return os.path.isdir(path) and any(f.endswith(".gguf") for f in os.listdir(path))


class K2GGUFModelLoader(GGUFModelLoader):
    def __init__(self, load_config: LoadConfig):
        # The stock loader refuses any extra config; ours reads force_dequant from it.
        BaseModelLoader.__init__(self, load_config)
        self.options = Options.parse(load_config.model_loader_extra_config)

    def loader_for(self, model_config) -> BaseModelLoader:
        """vLLM builds an EAGLE-3 drafter with its target's load config, so a GGUF target makes
        the drafter's checkpoint (safetensors) come here too: a model that is no GGUF file goes
        to vLLM's default loader, without the GGUF options."""
        if is_gguf_path(str(model_config.model)):
            return self
        plain = dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})
        return DefaultModelLoader(plain)

    def load_model(self, vllm_config, model_config, prefix: str = ""):
        loader = self.loader_for(model_config)
        if loader is not self:
            return loader.load_model(vllm_config, model_config, prefix)
        if not is_deepseek2(model_config.hf_config):
            if self.options.force:
                raise GGUFLoadError("force_dequant is implemented for deepseek2-architecture GGUFs only")
            return super().load_model(vllm_config, model_config, prefix)
        return load_deepseek2(self, vllm_config, model_config, prefix)
