"""speculators 0.3.0 on vLLM 0.16: its own hidden-states generator API, made correct.

Use in a data-generation script::

    from vllm_k2_plugin.speculators_compat import enable
    enable()  # applies the shim (and the plugin's other patches), once per process
    from speculators.data_generation.vllm_hidden_states_generator import VllmHiddenStatesGenerator

    gen = VllmHiddenStatesGenerator(model_path, layer_ids=None, max_model_len=2048)
    rows = gen.generate(token_ids)  # [{"input_ids", "hidden_states": [aux..., final], "loss_mask"}]

What changes for the caller (documented in ``gen.capture_metadata``): layer ids use
vLLM's EAGLE-3 convention (id i = residual stream entering layer i; N = after the
last layer) and default to (2, N//2, N-3); ``hidden_states`` holds those aux states
followed by the *post-norm* final state, which is what training targets need
(speculators PR #313). Everything else - constructor, ``generate()`` and its result
format - is speculators' own.
"""

from __future__ import annotations


def enable() -> None:
    """Apply the plugin's patches in this process (vLLM applies them itself only in the
    processes it starts). Importing this package applies nothing."""
    import vllm_k2_plugin

    vllm_k2_plugin.register()
