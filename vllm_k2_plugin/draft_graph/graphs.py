"""One CUDA graph per uniform decode shape for a whole ``propose`` call of vLLM's EAGLE
proposer.

Stock vLLM runs the drafter's passes under piecewise graphs: per pass the attention
metadata is rebuilt on the host, attention, lm_head and argmax launch eagerly, and the
host work dominates a draft step. Here the unchanged stock ``propose`` is captured once
per shape with its inputs in static buffers, run with the proposer's own graph dispatch
forced to "none" so that nothing replays inside the capture; later steps of that shape
copy their inputs in and replay.

What makes this sound, and is checked per call (anything else runs stock):
* uniform decode only: every request carries 1 + k query tokens (the verified step), so all
  shapes, and every host-side branch in ``propose``, are fixed by the key;
* every drafter attention layer uses a metadata builder on ``REPLAYABLE_BUILDERS``: their
  kernels read lengths from device tensors and take no host value that changes from step
  to step (TRITON_ATTN: the host-side ``max_seq_len`` is not used by its kernel);
* no multimodal embeddings in the call, and greedy drafts (vLLM releases that can sample
  drafts per request do so only when some request is not greedy: such steps run stock).
The first call of a shape runs stock (its result is returned), then the static-buffer
path once on the same inputs, which must give the same drafts, then the capture; any
failure leaves that shape on the stock path, logged once.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from .vllm_adapter import drafter_metadata_builders

#: Metadata builder classes (module, name) whose drafting metadata is replay-safe.
REPLAYABLE_BUILDERS = (("vllm.v1.attention.backends.triton_attn", "TritonAttentionMetadataBuilder"),)


def _logger():
    from ..log import get_logger

    return get_logger("draft_graph")


def _builder_classes() -> tuple[type, ...]:
    import importlib

    found = []
    for module, name in REPLAYABLE_BUILDERS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


class _Static:
    """Static copies of one call's tensors: the graph's inputs."""

    def __init__(self, args: dict[str, Any], cad_name: str):
        self.cad_name = cad_name
        self.tensors = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
        cad = args[cad_name]
        self.cad_tensors = {
            f.name: getattr(cad, f.name).clone()
            for f in dataclasses.fields(cad)
            if isinstance(getattr(cad, f.name), torch.Tensor) and getattr(cad, f.name).device.type != "cpu"
        }
        # The metadata as it came in: ``propose`` rebinds its host fields (max_query_len,
        # num_actual_tokens) and bumps its CPU tensors, so a capture after a stock run must
        # not read the caller's object.
        self.cad_as_called = dataclasses.replace(cad, **_host_tensors(cad, self.cad_tensors))

    def load(self, args: dict[str, Any]) -> None:
        for k, buf in self.tensors.items():
            buf.copy_(args[k], non_blocking=True)
        cad = args[self.cad_name]
        for k, buf in self.cad_tensors.items():
            buf.copy_(getattr(cad, k), non_blocking=True)

    def call_args(self, args: dict[str, Any], cad: Any = None) -> dict[str, Any]:
        """The call's arguments with every device tensor swapped for its static copy, and
        a fresh metadata object (``propose`` edits it) built from ``cad`` (default: the
        call's own, not yet run)."""
        cad = args[self.cad_name] if cad is None else cad
        out = {**args, **self.tensors}
        out[self.cad_name] = dataclasses.replace(cad, **self.cad_tensors, **_host_tensors(cad, self.cad_tensors))
        return out


def _host_tensors(cad: Any, on_device: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of the metadata's CPU tensors (``propose`` adds to some of them in place)."""
    return {
        f.name: getattr(cad, f.name).clone()
        for f in dataclasses.fields(cad)
        if isinstance(getattr(cad, f.name), torch.Tensor) and f.name not in on_device
    }


class _Graph:
    def __init__(self, static: _Static, graph: torch.cuda.CUDAGraph | None, out: torch.Tensor):
        self.static, self.graph, self.out = static, graph, out


class DraftGraphs:
    """Per proposer: graphs by shape key, the shapes that could not be captured."""

    def __init__(self, proposer: Any, original: Any, capture: bool):
        self.proposer, self.original, self.capture = proposer, original, capture
        self.signature = inspect.signature(original)
        params = list(self.signature.parameters)
        self.cad_name = next(n for n in params if n == "common_attn_metadata")
        self.graphs: dict[tuple, _Graph] = {}
        self.failed: set[tuple] = set()
        self.pool = None
        self.replays = 0
        self._builders_ok: bool | None = None

    # ------------------------------------------------------------------ eligibility
    def _replayable_builders(self) -> bool:
        if self._builders_ok is None:
            classes = _builder_classes()
            builders = drafter_metadata_builders(self.proposer)
            self._builders_ok = bool(builders) and all(isinstance(b, classes) for b in builders)
            if not self._builders_ok:
                names = sorted({type(b).__name__ for b in builders}) or ["none found"]
                _logger().info("vllm-k2: draft step stays stock: drafter attention %s is not replay-safe", names)
        return self._builders_ok

    def key(self, args: dict[str, Any]) -> tuple | None:
        cad = args[self.cad_name]
        reqs, tokens, q = cad.num_reqs, cad.num_actual_tokens, cad.max_query_len
        k = args.get("num_speculative_tokens", self.proposer.num_speculative_tokens)
        if q != 1 + k or tokens != reqs * q or args.get("mm_embed_inputs") is not None:
            return None  # not a verify step of uniform decode (a prefill, a partial batch)
        if self.capture and not self._replayable_builders():
            return None
        sampling = args.get("sampling_metadata")
        if getattr(self.proposer, "_enable_probabilistic_draft_probs", False) and not sampling.all_greedy:
            return None  # drafts sampled per request (its generators and temperatures are not static inputs)
        shapes = tuple(
            (name, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (name, v is None)
            for name, v in args.items()
            if name not in (self.cad_name, "sampling_metadata", "slot_mappings")
        )
        scalars = tuple((name, v) for name, v in args.items() if isinstance(v, (int, bool)))
        cad_shapes = tuple(
            (f.name, tuple(getattr(cad, f.name).shape))
            for f in dataclasses.fields(cad)
            if isinstance(getattr(cad, f.name), torch.Tensor)
        )
        return (reqs, tokens, q, shapes, scalars, cad_shapes)

    # ------------------------------------------------------------------ running
    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        bound = self.signature.bind(self.proposer, *args, **kwargs)
        call = {k: v for k, v in bound.arguments.items() if k != "self"}
        key = self.key(call)
        if key is None or key in self.failed:
            return self.original(self.proposer, **call)
        g = self.graphs.get(key)
        if g is None:
            static = _Static(call, self.cad_name)  # before the stock run: it edits seq_lens in place
            out = self.original(self.proposer, **call)
            self._build(key, static, call, out)
            return out
        g.static.load(call)
        if g.graph is None:  # no capture (CPU): the same static-buffer path, run eagerly
            return self.original(self.proposer, **g.static.call_args(call))
        g.graph.replay()
        self.replays += 1
        return g.out.clone()

    def _build(self, key: tuple, static: _Static, call: dict[str, Any], stock_out: torch.Tensor) -> None:
        """Run the static-buffer path once on this call's inputs (it also compiles the
        shape's kernels outside any capture); it must propose exactly what the stock run
        did, else the shape stays stock. Then capture it, where graphs are on."""
        p = self.proposer
        shape = f"{key[0]} requests x {key[2]} tokens"
        stock_dispatch = p.cudagraph_dispatcher
        p.cudagraph_dispatcher = _no_graph_dispatcher(p.vllm_config)
        try:
            again = self.original(p, **static.call_args(call, static.cad_as_called))
            if not torch.equal(again, stock_out):
                raise _Mismatch("its drafts differ from the stock step's on the same inputs")
            if not self.capture:
                self.graphs[key] = _Graph(static, None, torch.empty(0))
                _logger().info(
                    "vllm-k2: draft step for %s runs from static buffers (no CUDA graph capture here)", shape
                )
                return
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            # thread_local: the engine's other threads (output copies) keep running during a capture
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = self.original(p, **static.call_args(call, static.cad_as_called))
            self.pool = graph.pool()
            self.graphs[key] = _Graph(static, graph, out)
            _logger().info("vllm-k2: draft step captured as one CUDA graph for %s", shape)
        except Exception as e:  # noqa: BLE001 - any failure here: this shape stays stock
            self.failed.add(key)
            _logger().warning("vllm-k2: draft step for %s stays stock (%s: %s)", shape, type(e).__name__, e)
        finally:
            p.cudagraph_dispatcher = stock_dispatch


class _Mismatch(RuntimeError):
    pass


def _no_graph_dispatcher(vllm_config: Any) -> Any:
    """A dispatcher of vLLM's own that never picks a graph (no replay inside our capture)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    d = CudagraphDispatcher(vllm_config)
    d.initialize_cudagraph_keys(CUDAGraphMode.NONE)
    return d
