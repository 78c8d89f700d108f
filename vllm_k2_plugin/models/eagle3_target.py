"""EAGLE-3 on the target side: DeepSeek-V2/V3 and the Kimi-K2.5 wrapper emit aux
hidden states (backport of what vLLM >= 0.18 has upstream).

Convention (vLLM's, pinned here and in our exports): aux layer id ``i`` is the
residual stream *entering* decoder layer ``i`` (``hidden_states + residual``);
``i == num_hidden_layers`` is the stream after the last layer, before the final
norm. Default ids ``(2, N // 2, N - 3)``. SpecForge/SGLang count "output of layer
i-1" and add +1 to explicit ids: a SpecForge id ``j`` is vLLM id ``j + 1``.

Pipeline parallel: each rank captures the ids inside its own layer range; only
the last rank returns them (vLLM asks the last rank for the draft inputs).
"""

from __future__ import annotations

from itertools import islice

from ..patching import REGISTRY, PatchContext

DS = "vllm.model_executor.models.deepseek_v2"
K25 = "vllm.model_executor.models.kimi_k25"


def _deepseek_has_eagle3() -> bool:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM

    return bool(getattr(DeepseekV2ForCausalLM, "supports_eagle3", False))


def _model_forward_with_aux(original_forward):
    """DeepseekV2Model.forward that also returns the aux hidden states."""

    def forward(self, input_ids, positions, intermediate_tensors, inputs_embeds=None):
        aux_ids = getattr(self, "aux_hidden_state_layers", ())
        if not aux_ids:
            return original_forward(self, input_ids, positions, intermediate_tensors, inputs_embeds)
        from vllm.distributed import get_pp_group
        from vllm.sequence import IntermediateTensors

        pp = get_pp_group()
        if pp.is_first_rank:
            hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            hidden = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        scaling = _llama4_scaling(self.config, positions)
        aux = []
        for idx, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), self.start_layer):
            if idx in aux_ids:
                aux.append(hidden if residual is None else hidden + residual)
            hidden, residual = layer(positions, hidden, residual, scaling)
        if self.end_layer in aux_ids:
            aux.append(hidden + residual)
        if not pp.is_last_rank:
            return IntermediateTensors({"hidden_states": hidden, "residual": residual})
        hidden, _ = self.norm(hidden, residual)
        return hidden, aux

    return forward


def _llama4_scaling(config, positions):
    cfg = getattr(config, "llama_4_scaling", None)
    if cfg is None:
        return None
    from vllm.model_executor.models.deepseek_v2 import _get_llama_4_scaling

    return _get_llama_4_scaling(
        original_max_position_embeddings=cfg["original_max_position_embeddings"],
        scaling_beta=cfg["beta"],
        positions=positions,
    )


def _set_aux_layers(self, layers) -> None:
    n = self.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= int(i) <= n]
    if bad:
        raise ValueError(
            f"EAGLE-3 aux hidden state layer ids {list(layers)} are out of range for a "
            f"{n}-layer target (valid: 0..{n}, vLLM convention: input of layer i)"
        )
    self.model.aux_hidden_state_layers = tuple(int(i) for i in layers)


def _get_aux_layers(self) -> tuple[int, ...]:
    from vllm_k2_plugin.hf_config import default_aux_layer_ids

    return tuple(default_aux_layer_ids(self.config.num_hidden_layers))


@REGISTRY.patch(
    name="deepseek-eagle3-aux-hidden-states",
    feature="eagle3",
    target=f"{DS}:DeepseekV2Model.forward",
    applies_to=">=0.16,<0.35",
    already_upstream=_deepseek_has_eagle3,
    upstream="vllm-project/vllm#36361 (DeepSeek/Kimi EAGLE-3 target support, in >= 0.18)",
    why="DeepSeek-V2/V3 (Kimi-K2.5's language model) cannot feed an EAGLE-3 drafter on 0.16",
    remove_when="minimum supported vLLM >= 0.18",
    patch_file="0003-deepseek-eagle3-aux-hidden-states.patch",
)
def _apply_deepseek(ctx: PatchContext) -> None:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV2Model

    ctx.target()  # names this patch if forward moved
    ctx.wrap(DeepseekV2Model, "forward", _model_forward_with_aux)
    ctx.replace(DeepseekV2Model, "aux_hidden_state_layers", ())
    ctx.replace(DeepseekV2ForCausalLM, "supports_eagle3", True)
    ctx.replace(DeepseekV2ForCausalLM, "set_aux_hidden_state_layers", _set_aux_layers)
    ctx.replace(DeepseekV2ForCausalLM, "get_eagle3_aux_hidden_state_layers", _get_aux_layers)


def _upstream_emits_final_aux() -> bool:
    """Run stock ``DeepseekV2Model.forward`` on a bare two-layer model (layers, embedding
    and norm stood in for by tensor functions, one pipeline rank) asking for ids 1 and 2:
    upstream has the convention if it returns both (0.32 does; 0.20 returns only id 1)."""
    import importlib
    from types import SimpleNamespace

    import torch

    ds = importlib.import_module(DS)
    model = ds.DeepseekV2Model.__new__(ds.DeepseekV2Model)
    torch.nn.Module.__init__(model)
    layer = lambda positions, hidden, residual, *a: (hidden * 2, hidden if residual is None else residual)  # noqa: E731
    vars(model).update(
        config=SimpleNamespace(),
        layers=[layer, layer],
        start_layer=0,
        end_layer=2,
        aux_hidden_state_layers=(1, 2),
        embed_input_ids=lambda ids: ids.float()[:, None],
        norm=lambda hidden, residual: (hidden + residual, None),
    )
    stock_pp = ds.get_pp_group
    ds.get_pp_group = lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)
    try:
        out = ds.DeepseekV2Model.forward(model, torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), None)
    finally:
        ds.get_pp_group = stock_pp
    return isinstance(out, tuple) and len(out[1]) == 2


def _base_backport_applied() -> str | None:
    state = REGISTRY["deepseek-eagle3-aux-hidden-states"].state.value
    if state != "retired-upstream":
        return f"deepseek-eagle3-aux-hidden-states is {state} (its forward has the final-layer id)"
    return None


@REGISTRY.patch(
    name="deepseek-eagle3-final-layer-aux",
    feature="eagle3",
    target=f"{DS}:DeepseekV2Model.forward",
    applies_to=">=0.16,<0.35",
    only_if=_base_backport_applied,
    already_upstream=_upstream_emits_final_aux,
    upstream="in vLLM by 0.32 (DeepseekV2Model appends the stream after its last layer)",
    why=(
        "upstream EAGLE-3 for DeepSeek (0.18+) skips aux id == num_hidden_layers (the stream after the last "
        "layer): a drafter trained on it fails with a shape error in its fc (0.20 on the H200)"
    ),
    remove_when="minimum supported vLLM's DeepseekV2Model emits the final-layer aux state (the probe sees it)",
)
def _apply_final_aux(ctx: PatchContext) -> None:
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model

    ctx.target()
    ctx.wrap(DeepseekV2Model, "forward", _model_forward_with_aux)


def _kimi_has_eagle3() -> bool:
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration

    return bool(getattr(KimiK25ForConditionalGeneration, "supports_eagle3", False))


def _wrapper_set_aux(self, layers) -> None:
    self.language_model.set_aux_hidden_state_layers(layers)


def _wrapper_get_aux(self) -> tuple[int, ...]:
    return self.language_model.get_eagle3_aux_hidden_state_layers()


@REGISTRY.patch(
    name="kimi-k25-eagle3-passthrough",
    feature="eagle3",
    target=f"{K25}:KimiK25ForConditionalGeneration",
    applies_to=">=0.16,<0.35",
    already_upstream=_kimi_has_eagle3,
    upstream="vllm-project/vllm#35966 (Kimi-K2.5 EAGLE-3, in >= 0.18)",
    why="the K2.5 multimodal wrapper does not declare SupportsEagle3, so vLLM refuses aux states",
    remove_when="minimum supported vLLM >= 0.18",
    patch_file="0004-kimi-k25-eagle3-passthrough.patch",
)
def _apply_kimi(ctx: PatchContext) -> None:
    cls = ctx.target()
    # The wrapper's forward already returns the language model's output unchanged,
    # so the (hidden, aux) tuple flows through; only the interface is missing.
    ctx.replace(cls, "supports_eagle3", True)
    # vLLM checks isinstance(model, SupportsEagle3), a runtime Protocol that also
    # requires SupportsEagleBase's flags: without them the check fails on GPU.
    for flag in ("has_own_lm_head", "has_own_embed_tokens"):
        if not hasattr(cls, flag):
            ctx.replace(cls, flag, False)
    ctx.replace(cls, "set_aux_hidden_state_layers", _wrapper_set_aux)
    ctx.replace(cls, "get_eagle3_aux_hidden_state_layers", _wrapper_get_aux)


class _ReachedLanguageModel(Exception):
    """Raised by the stand-in K2.5 wrapper once the proposer is past its image token."""


#: K2.5's media placeholder token id (the stand-in config's only id).
_MEDIA_PLACEHOLDER = 163_605


def _proposer_knows_kimi() -> bool:
    """Run the EAGLE proposer's ``load_model`` up to its multimodal branch on a stand-in
    K2.5 wrapper whose config has ``media_placeholder_token_id`` and no
    ``image_token_index`` (the drafter and the layer lookup stood in too, as nothing is
    loaded): upstream knows K2.5 when the drafter gets the placeholder as its image token."""
    import importlib
    from types import SimpleNamespace

    from ..draft_graph.vllm_adapter import proposer_class

    cls = proposer_class()
    owner = next(c for c in cls.__mro__ if "load_model" in vars(c))
    module = importlib.import_module(owner.__module__)
    drafter = SimpleNamespace(config=SimpleNamespace())

    class KimiK25ForConditionalGeneration:  # vLLM branches on the class name
        supports_multimodal = True
        config = SimpleNamespace(media_placeholder_token_id=_MEDIA_PLACEHOLDER)

        def get_language_model(self):
            raise _ReachedLanguageModel

    probe = cls.__new__(cls)
    probe.vllm_config, probe.supports_mm_inputs, probe._get_model = None, False, lambda: drafter
    lookup = module.get_layers_from_vllm_config
    module.get_layers_from_vllm_config = lambda *a, **kw: {}
    try:
        owner.load_model(probe, KimiK25ForConditionalGeneration())
    except _ReachedLanguageModel:
        return getattr(drafter.config, "image_token_index", None) == _MEDIA_PLACEHOLDER
    except AttributeError as e:
        if "image_token_index" in str(e):  # the stock branch reads config.image_token_index
            return False
        raise
    finally:
        module.get_layers_from_vllm_config = lookup
    return False


@REGISTRY.patch(
    name="kimi-k25-image-token-index",
    feature="eagle3",
    target="vllm.transformers_utils.configs.kimi_k25:KimiK25Config",
    applies_to=">=0.16,<0.32",
    why_range_ends=(
        "from vLLM 0.32 K2.5's config is transformers' Kimi_K25Config (vllm.transformers_utils.configs.kimi_k25 "
        "is gone), and vLLM's drafter reads media_placeholder_token_id itself since 0.18"
    ),
    already_upstream=_proposer_knows_kimi,
    upstream="vllm-project/vllm#35966 (proposer reads media_placeholder_token_id for K2.5)",
    why="the EAGLE proposer reads config.image_token_index, which KimiK25Config lacks (AttributeError)",
    remove_when="minimum supported vLLM >= 0.18",
    patch_file="0004-kimi-k25-eagle3-passthrough.patch",
)
def _apply_image_token(ctx: PatchContext) -> None:
    cls = ctx.target()
    ctx.replace(cls, "image_token_index", property(lambda self: self.media_placeholder_token_id))
