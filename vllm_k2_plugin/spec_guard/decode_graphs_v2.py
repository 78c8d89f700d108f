"""k = 0 from the guard under Model Runner V2: a one-token decode step replays a full CUDA graph.

vLLM 0.26's Model Runner V2 captures its full decode graphs for the query lengths a speculative
engine can schedule: 1 + k for a fixed k, or 1 + each k of the user's per-batch-size table. A
step the guard schedules at k = 0 (one token per request) matches none of them and runs the
mixed path (piecewise graphs, attention eager), the v1 runner's trouble that
``spec-guard-decode-graphs`` fixes there (H100, 0.16 and 0.20: before that fix a guard step
with almost no drafts cost 2.6-3x a step without speculation, benchmarks/results/load_gpu).
Here, while V2 plans its target model's graphs, its graph manager sees a per-batch-size table
holding k = 0 beside the engine's k, so it plans full graphs for both query lengths, captures
them with its own code and dispatches one-token steps to them. Nothing else reads that table:
the scheduler keeps its own lookup (which the guard writes) and the drafter's graphs are left
as vLLM plans them.

Read in vLLM 0.26.0's sources (``CudaGraphManager._init_candidates``). Measured on an H100
(vLLM 0.26, 6-layer K2.5 slice, benchmarks/results/spec_guard_gpu/): a step at k = 0 cost 1.29x
a plain step at 4k context with these graphs, 3.1x without them.
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V2, PatchContext, scope
from .drafter_off_v2 import V2_GUARD_RANGE, V2_GUARD_RANGE_ENDS
from .patch import switched_off

MODULE = "vllm.v1.worker.gpu.cudagraph_utils"


class _Delegate:
    """An object that answers as ``real`` does, but for the attributes set on it."""

    def __init__(self, real, **own):
        self._real = real
        self.__dict__.update(own)

    def __getattr__(self, name):
        return getattr(self._real, name)


def with_one_token_decode(vllm_config, max_num_reqs: int):
    """``vllm_config`` as a graph planner should see it to plan decode graphs for k = 0 as well
    as for the engine's k, or None where there is nothing to add (no speculation, or a
    per-batch-size table of the user's, which V2 plans for as given)."""
    spec = vllm_config.speculative_config
    if spec is None or spec.uses_dynamic_speculative_decoding():
        return None
    k = vllm_config.num_speculative_tokens
    if not k:
        return None
    # two disjoint ranges so that a planner expanding the table into a per-size lookup gets both
    table = [(1, 1, 0), (2, max(2, max_num_reqs), k)]
    spec_view = _Delegate(
        spec,
        num_speculative_tokens_per_batch_size=table,
        uses_dynamic_speculative_decoding=lambda: True,
    )
    return _Delegate(vllm_config, speculative_config=spec_view)


def _wrap_init_candidates(original):
    def _init_candidates(self):
        view = None
        if scope.acts("spec-guard-v2-decode-graphs", self.vllm_config):
            view = with_one_token_decode(self.vllm_config, self.max_num_reqs)
        if view is None:
            return original(self)
        real, self.vllm_config = self.vllm_config, view
        try:
            return original(self)
        finally:
            self.vllm_config = real

    return _init_candidates


def _upstream_plans_one_token_graphs() -> bool:
    """Does V2 plan full decode graphs for one token per request in a speculative engine of
    its own accord? Asked of its planner: a stand-in manager (k = 3, full and piecewise graphs,
    no table of the user's) plans its graphs; upstream has this where one of them is for one
    token per request."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    manager = planned_manager(ModelCudaGraphManager, CUDAGraphMode.FULL_AND_PIECEWISE, k=3)
    return one_token_decode_sizes(manager) != []


def planned_manager(cls, mode, k: int, sizes=(1, 2, 4, 8, 16), max_num_reqs: int = 16, config=(), manager=()):
    """A graph manager of class ``cls`` whose ``_init_candidates`` planned the graphs of a
    speculative engine with ``k`` drafts (no GPU: only the planner runs). ``config`` and
    ``manager``: further attributes of the engine's config and of the manager, for planners of
    later releases, which read more than 0.26's."""
    spec = _Delegate(object(), num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None)
    spec.uses_dynamic_speculative_decoding = lambda: False
    compilation = _Delegate(object(), cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=max(sizes))
    vllm_config = _Delegate(
        object(), speculative_config=spec, num_speculative_tokens=k, compilation_config=compilation, **dict(config)
    )
    planner = cls.__new__(cls)
    planner.__dict__.update(
        vllm_config=vllm_config,
        compilation_config=compilation,
        max_num_reqs=max_num_reqs,
        cudagraph_mode=mode,
        decode_query_len=1 + k,
        lora_capture_cases=[0],
        use_breakable_cg=False,
        _candidates={},
        _capture_descs={},
        **dict(manager),
    )
    planner._init_candidates()
    return planner


def one_token_decode_sizes(manager) -> list[int]:
    """The batch sizes for which ``manager`` planned a full graph of one token per request."""
    return sorted(
        d.num_tokens for descs in manager._capture_descs.values() for d in descs if d.uniform_token_count == 1
    )


@REGISTRY.patch(
    name="spec-guard-v2-decode-graphs",
    feature="spec_guard",
    target=f"{MODULE}:ModelCudaGraphManager",
    applies_to=V2_GUARD_RANGE,
    needs_whole_feature=True,
    model_runner=RUNNER_V2,
    why_range_ends=V2_GUARD_RANGE_ENDS,
    only_if=switched_off,
    already_upstream=_upstream_plans_one_token_graphs,
    upstream="none yet (later releases capture decode graphs of any query length up to 1 + k)",
    why="Model Runner V2 plans full decode graphs only for 1 + k tokens per request (vLLM 0.26's sources)",
    remove_when="V2 plans full graphs for one-token decode steps of a speculative engine (the probe asks its planner)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    ctx.target()
    # the target model's manager only: the drafter's graphs have their own manager class
    ctx.wrap(cudagraph_utils.ModelCudaGraphManager, "_init_candidates", _wrap_init_candidates)
