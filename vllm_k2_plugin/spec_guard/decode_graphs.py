"""A step the guard schedules at k = 0 replays a full CUDA graph, as a step without speculation does.

vLLM's v1 runner captures its full decode CUDA graphs for one query length per request:
1 + k with speculation. A decode step of one token per request (every k = 0 step of the
guard) is not "uniform decode" for it and runs the mixed path: piecewise graphs with
attention eager in between, or no graph at all for sizes only the decode list has. On the
H100 under load a guard step with almost no drafts cost 2.6-3x a step of an engine without
speculation (benchmarks/results/load_gpu). The plugin captures full graphs for one-token
decode batches as well, at the batch sizes an engine without speculation would use
(vLLM's capture sizes before it rounds them to multiples of 1 + k, up to max_num_seqs), and
dispatches a one-token decode step to them. Batches of another query length are left to vLLM.

The extra graphs are captured in vLLM's own capture loop, after its own, with vLLM's
dummy-run code: for their capture and dispatch only, the runner and its dispatcher see a
decode query length of 1 and the padding of those sizes. If their capture fails, they are
dropped with an error in the log and the engine serves with vLLM's graphs.
"""

from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass

from ..log import get_logger
from ..patching import REGISTRY, RUNNER_V1, PatchContext, scope
from .patch import V1_RUNNER_GONE, switched_off

MODULE = "vllm.v1.worker.gpu_model_runner"
ATTR = "_vllm_k2_one_token_graphs"
#: vLLM's own smallest capture sizes (``CompilationConfig``'s default list starts 1, 2, 4, 8, ...):
#: the sizes speculation rounds away and a one-token step of a few requests needs.
SMALL_SIZES = (1, 2, 4)


@dataclass
class OneTokenGraphs:
    """The full-graph keys for one-token decode batches and the padding that reaches them."""

    keys: list
    #: batch size -> padded size, for one-token decode steps (vLLM's list with our sizes)
    padded: list[int]

    @property
    def sizes(self) -> list[int]:
        return sorted({key.num_tokens for key in self.keys})


def plan(dispatcher) -> OneTokenGraphs | None:
    """The one-token graphs a dispatcher whose keys vLLM just initialised should add, or None
    (no speculation, no full decode graphs, the feature not acting for this model)."""
    from vllm.config import CUDAGraphMode

    mode = dispatcher.cudagraph_mode
    if dispatcher.uniform_decode_query_len <= 1 or mode == CUDAGraphMode.NONE:
        return None
    if not (mode.decode_mode() == CUDAGraphMode.FULL and mode.separate_routine()):
        return None
    if not scope.acts("spec-guard-decode-graphs", dispatcher.vllm_config):
        return None
    compilation = dispatcher.compilation_config
    limit = min(compilation.max_cudagraph_capture_size, dispatcher.vllm_config.scheduler_config.max_num_seqs)
    sizes = sorted({s for s in (*SMALL_SIZES, *compilation.cudagraph_capture_sizes) if s <= limit})
    if not sizes:
        return None
    stock = dispatcher._bs_to_padded_graph_size
    padded = [0] + [sizes[bisect.bisect_left(sizes, n)] if n <= sizes[-1] else stock[n] for n in range(1, len(stock))]
    have = dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
    keys = []
    with _one_token(dispatcher, padded):
        for size in sizes:
            for loras in dispatcher._get_lora_cases():
                key = dispatcher._create_padded_batch_descriptor(size, True, loras > 0, loras)
                if key not in have and key.num_reqs == size:
                    keys.append(key)
    return OneTokenGraphs(keys, padded) if keys else None


@contextmanager
def _one_token(dispatcher, padded: list[int]):
    saved = dispatcher.uniform_decode_query_len, dispatcher._bs_to_padded_graph_size
    dispatcher.uniform_decode_query_len, dispatcher._bs_to_padded_graph_size = 1, padded
    try:
        yield
    finally:
        dispatcher.uniform_decode_query_len, dispatcher._bs_to_padded_graph_size = saved


@contextmanager
def one_token_decode(runner, graphs: OneTokenGraphs):
    """While inside, the runner and its dispatcher treat one-token decode batches as the
    uniform decode batches of their full graphs, padded to our sizes."""
    saved = runner.uniform_decode_query_len
    runner.uniform_decode_query_len = 1
    try:
        with _one_token(runner.cudagraph_dispatcher, graphs.padded):
            yield
    finally:
        runner.uniform_decode_query_len = saved


def _wrap_initialize_keys(original):
    def initialize_cudagraph_keys(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            graphs = plan(self)
        except Exception:  # noqa: BLE001 - a dispatcher this was not written for: vLLM's keys only
            get_logger("spec_guard").exception(
                "vllm-k2: planning full CUDA graphs for one-token decode steps failed; "
                "k = 0 steps of the speculation guard run vLLM's mixed path"
            )
            graphs = None
        if graphs is not None:
            from vllm.config import CUDAGraphMode

            for key in graphs.keys:
                self.add_cudagraph_key(CUDAGraphMode.FULL, key)
        setattr(self, ATTR, graphs)

    return initialize_cudagraph_keys


def _graphs(runner) -> OneTokenGraphs | None:
    return getattr(getattr(runner, "cudagraph_dispatcher", None), ATTR, None)


def _drop(runner, graphs: OneTokenGraphs) -> None:
    from vllm.config import CUDAGraphMode

    runner.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL].difference_update(graphs.keys)
    setattr(runner.cudagraph_dispatcher, ATTR, None)


def _wrap_capture_cudagraphs(original):
    def _capture_cudagraphs(self, batch_descriptors, cudagraph_runtime_mode, *args, **kwargs):
        graphs = _graphs(self)
        ours = set(graphs.keys) if graphs is not None else set()
        theirs = [d for d in batch_descriptors if d not in ours]
        mine = [d for d in batch_descriptors if d in ours]
        if theirs or not mine:
            original(self, theirs, cudagraph_runtime_mode, *args, **kwargs)
        if not mine:
            return
        try:
            with one_token_decode(self, graphs):
                original(self, mine, cudagraph_runtime_mode, *args, **kwargs)
        except Exception:  # noqa: BLE001 - our extra graphs must never stop the engine
            get_logger("spec_guard").exception(
                "vllm-k2: capturing full CUDA graphs for one-token decode steps failed; "
                "k = 0 steps of the speculation guard run vLLM's mixed path instead"
            )
            _drop(self, graphs)
            return
        get_logger("spec_guard").info(
            "vllm-k2: full CUDA graphs for one-token decode steps captured (batch sizes %s)", graphs.sizes
        )

    return _capture_cudagraphs


def _one_token_batch(runner, step: dict) -> OneTokenGraphs | None:
    """Our graphs if this dispatch is of a decode step of one token per request (not a capture:
    a capture says what it captures through ``force_uniform_decode``)."""
    graphs = _graphs(runner)
    if graphs is None or step.get("force_uniform_decode") is not None or step["max_num_scheduled_tokens"] != 1:
        return None
    return graphs if step["num_tokens"] == step["num_reqs"] else None


def _wrap_determine(original):
    import inspect

    signature = inspect.signature(original)  # vLLM's runner passes these by keyword, captures too

    def _determine_batch_execution_and_padding(self, *args, **kwargs):
        graphs = _one_token_batch(self, signature.bind(self, *args, **kwargs).arguments)
        if graphs is None:
            return original(self, *args, **kwargs)
        with one_token_decode(self, graphs):
            return original(self, *args, **kwargs)

    return _determine_batch_execution_and_padding


def stand_in_runner(num_spec_tokens: int = 3, max_num_seqs: int = 16, capture_sizes=(4, 8, 12, 16)):
    """A bare v1 runner of a speculative engine (full decode graphs only, no LoRA, one rank)
    around vLLM's own cudagraph dispatcher, its keys initialised as vLLM's runner does: enough
    state for vLLM's own batch dispatch (``_determine_batch_execution_and_padding``)."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sizes = sorted(capture_sizes)
    compilation = SimpleNamespace(
        cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
        cudagraph_capture_sizes=sizes,
        max_cudagraph_capture_size=sizes[-1],
        compile_sizes=[],
        cudagraph_specialize_lora=False,
        pass_config=SimpleNamespace(enable_sp=False),
        requires_piecewise_compilation=lambda: False,
        is_attention_compiled_piecewise=lambda: True,
        splitting_ops_contain_attention=lambda: True,
    )
    config = SimpleNamespace(
        compilation_config=compilation,
        speculative_config=SimpleNamespace(num_speculative_tokens=num_spec_tokens),
        num_speculative_tokens=num_spec_tokens,  # where later releases read it
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        lora_config=None,
        parallel_config=SimpleNamespace(data_parallel_size=1, tensor_parallel_size=1),
        observability_config=SimpleNamespace(cudagraph_metrics=False),
        model_config=SimpleNamespace(is_encoder_decoder=False),
    )
    dispatcher = CudagraphDispatcher(config)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, 1 + num_spec_tokens)
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.vllm_config, runner.compilation_config, runner.cudagraph_dispatcher = config, compilation, dispatcher
    runner.model_config, runner.parallel_config = config.model_config, config.parallel_config
    runner.uniform_decode_query_len = 1 + num_spec_tokens
    runner.input_batch = SimpleNamespace(lora_id_to_lora_request={})
    runner.max_num_reqs = max_num_seqs
    return runner


def dispatch_one_token_step(runner, num_reqs: int):
    """vLLM's runner's dispatch of a decode step of one token for each of ``num_reqs`` requests:
    (cudagraph mode, batch descriptor)."""
    import numpy as np
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    tokens = np.ones(num_reqs, dtype=np.int32)
    result = GPUModelRunner._determine_batch_execution_and_padding(
        runner,
        num_tokens=num_reqs,
        num_reqs=num_reqs,
        num_scheduled_tokens_np=tokens,
        max_num_scheduled_tokens=1,
        use_cascade_attn=False,
    )
    return result[0], result[1]


def _upstream_has_one_token_graphs() -> bool:
    """A bare stock runner of a k = 3 engine with full decode graphs: upstream has this if a
    decode step of one token for each of 3 requests dispatches to a full graph."""
    from vllm.config import CUDAGraphMode

    try:
        runner = stand_in_runner()
        mode, _ = dispatch_one_token_step(runner, 3)
    except Exception:  # noqa: BLE001 - stock reaches for more runner state: no such dispatch
        return False
    return mode == CUDAGraphMode.FULL


@REGISTRY.patch(
    name="spec-guard-decode-graphs",
    feature="spec_guard",
    target=f"{MODULE}:GPUModelRunner._determine_batch_execution_and_padding",
    applies_to=">=0.16,<0.34",
    needs_whole_feature=True,
    model_runner=RUNNER_V1,
    why_range_ends=V1_RUNNER_GONE,
    only_if=switched_off,
    already_upstream=_upstream_has_one_token_graphs,
    upstream="none yet (vLLM's v1 runner captures full decode graphs for 1 + k tokens per request only)",
    why="a guard step with (almost) no drafts cost 2.6-3x a step without speculation on the H100 under load",
    remove_when="vLLM dispatches one-token decode steps of a speculative engine to full graphs (the probe)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker import gpu_model_runner

    ctx.target()
    from vllm.v1 import cudagraph_dispatcher

    cls = gpu_model_runner.GPUModelRunner
    ctx.wrap(cudagraph_dispatcher.CudagraphDispatcher, "initialize_cudagraph_keys", _wrap_initialize_keys)
    ctx.wrap(cls, "_capture_cudagraphs", _wrap_capture_cudagraphs)
    ctx.wrap(cls, "_determine_batch_execution_and_padding", _wrap_determine)
