"""Where the EAGLE proposer's pieces live, per vLLM version.

Kept apart so that graphs.py and the patches have no version branches. What differs
(read from the sources of the versions we run on):

=========  =====================================================================
0.16       ``SpecDecodeBaseProposer`` in ``eagle.py`` defines ``propose``; the
           drafter's layers share one metadata builder (``attn_metadata_builder``,
           else found through the runner by ``_get_attention_metadata_builder()``).
           CPU engine: the patches apply, probe and dispatcher checked (no CPU spec
           decode, so the draft step itself never ran on 0.16).
0.20       ``SpecDecodeBaseProposer`` in ``llm_base_proposer.py``; one builder per
           drafter attention group (``draft_attn_groups``). Proven on the H200.
0.32       as 0.20 (CPU engine: the static-buffer path against stock drafts).
=========  =====================================================================

The same on all three: ``EagleProposer`` in ``eagle.py``, ``propose(...,
common_attn_metadata, sampling_metadata, ...)``, the proposer's ``cudagraph_dispatcher``
and ``initialize_cudagraph_keys(mode)``, and the platform's
``get_attn_backend_cls(selected_backend, attn_selector_config, ...)``.
"""

from __future__ import annotations

from typing import Any

PROPOSER_MODULE = "vllm.v1.spec_decode.eagle"
PROPOSER = f"{PROPOSER_MODULE}:EagleProposer"


def proposer_class() -> type:
    from vllm.v1.spec_decode.eagle import EagleProposer

    return EagleProposer


def propose_owner() -> type:
    """The class that defines the ``propose`` EagleProposer runs (SpecDecodeBaseProposer,
    in eagle.py on 0.16, llm_base_proposer.py later): the patch wraps it there."""
    return next(c for c in proposer_class().__mro__ if "propose" in vars(c))


def drafter_metadata_builders(proposer: Any) -> list:
    """The attention-metadata builders of the drafter's layers."""
    groups = getattr(proposer, "draft_attn_groups", None)
    if groups is not None:  # 0.20+
        return [g.get_metadata_builder() for g in groups]
    builder = getattr(proposer, "attn_metadata_builder", None)  # 0.16
    return [builder if builder is not None else proposer._get_attention_metadata_builder()]
