"""Patch ``draft-step-graph``: vLLM's EAGLE proposer replays a uniform decode step's
whole ``propose`` as one CUDA graph (see graphs.py)."""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from ..settings import ENV_DRAFT_GRAPH, draft_graph_setting
from .vllm_adapter import PROPOSER, propose_owner, proposer_class

ATTR = "_vllm_k2_draft_graphs"


def _capture_possible() -> bool:
    from ..platform import on_cuda

    return on_cuda()


def _not_wanted() -> str | None:
    setting = draft_graph_setting()
    if setting == "off":
        return f"{ENV_DRAFT_GRAPH}=0"
    if setting == "auto" and not _capture_possible():
        return f"no CUDA device (set {ENV_DRAFT_GRAPH}=1 to run the same static-buffer path uncaptured)"
    return None


def _upstream_graphs_drafts() -> bool:
    """Hand a bare proposer a FULL_AND_PIECEWISE engine mode: stock vLLM keeps its
    drafter on piecewise graphs; an upstream with full draft graphs passes FULL on."""
    from vllm.config import CUDAGraphMode

    seen = []
    cls = proposer_class()
    probe = cls.__new__(cls)
    probe.speculative_config = type("Spec", (), {"enforce_eager": False})()
    probe.cudagraph_dispatcher = type("D", (), {"initialize_cudagraph_keys": lambda self, m, *a, **k: seen.append(m)})()
    try:
        cls.initialize_cudagraph_keys(probe, CUDAGraphMode.FULL_AND_PIECEWISE)
    except Exception:  # noqa: BLE001 - a changed signature: treat as not upstream, the patch's own checks run
        return False
    return bool(seen) and seen[-1].decode_mode() == CUDAGraphMode.FULL


def _wrap_propose(original):
    def propose(self, *args, **kwargs):
        graphs = self.__dict__.get(ATTR)
        if graphs is None:
            from .graphs import DraftGraphs

            if scope.acts("draft-step-graph", self.vllm_config):
                capture = _capture_possible() and uses_graphs(self.vllm_config, self.speculative_config)
                graphs = DraftGraphs(self, original, capture=capture)
            else:
                graphs = False  # a model outside the family: vLLM's propose, decided once per proposer
            self.__dict__[ATTR] = graphs
        if graphs is False:
            return original(self, *args, **kwargs)
        return graphs(*args, **kwargs)

    return propose


def uses_graphs(vllm_config, speculative_config) -> bool:
    """Capture only where the engine runs CUDA graphs at all (not under enforce_eager)."""
    from vllm.config import CUDAGraphMode

    mode = vllm_config.compilation_config.cudagraph_mode
    return mode is not None and mode != CUDAGraphMode.NONE and not speculative_config.enforce_eager


@REGISTRY.patch(
    name="draft-step-graph",
    feature="draft_graph",
    target=f"{PROPOSER}.propose",
    applies_to=">=0.16,<0.34",
    model_runner=RUNNER_V1,
    why_range_ends="vLLM 0.34 removed the v1 EAGLE proposer (vllm/v1/spec_decode/eagle.py) with its v1 model runner",
    only_if=_not_wanted,
    already_upstream=_upstream_graphs_drafts,
    upstream="none yet (vLLM's EAGLE proposer supports piecewise graphs only)",
    why="the drafter's k passes are host-bound under piecewise graphs (metadata, attention, lm_head per pass)",
    remove_when="vLLM captures the draft passes in full graphs (the probe sees FULL reach the drafter's dispatcher)",
)
def _apply(ctx: PatchContext) -> None:
    ctx.target()
    ctx.wrap(propose_owner(), "propose", _wrap_propose)
