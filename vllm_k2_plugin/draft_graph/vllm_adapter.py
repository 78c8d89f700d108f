"""Where the EAGLE proposer's pieces live, per vLLM version.

Kept apart so that graphs.py and the patches have no version branches. What differs
(read from the sources of the versions we run on; each row is exercised by a test):

=========  =====================================================================
0.16       ``EagleProposer`` defines ``propose``; the drafter's layers share one
           metadata builder (``attn_metadata_builder``, else found through the
           runner by ``_get_attention_metadata_builder()``).
0.20       ``EagleProposer`` inherits ``propose`` from ``SpecDecodeBaseProposer``;
           one builder per drafter attention group (``draft_attn_groups``).
           Proven on the H200.
0.32       as 0.20.
=========  =====================================================================

The same on all three: ``propose(..., common_attn_metadata, sampling_metadata, ...)``,
the proposer's ``cudagraph_dispatcher`` and ``initialize_cudagraph_keys(mode)``, and the
platform's ``get_attn_backend_cls(selected_backend, attn_selector_config, ...)``.
"""

from __future__ import annotations

from typing import Any

PROPOSER_MODULE = "vllm.v1.spec_decode.eagle"
PROPOSER = f"{PROPOSER_MODULE}:EagleProposer"
TESTED_RELEASES = ("0.16", "0.20", "0.32")


def proposer_class() -> type:
    from vllm.v1.spec_decode.eagle import EagleProposer

    return EagleProposer


def propose_owner() -> type:
    """The class whose ``propose`` the EAGLE proposer runs (0.16: EagleProposer itself;
    0.20+: SpecDecodeBaseProposer): wrapped there, as before the 0.16 adapter existed."""
    return next(c for c in proposer_class().__mro__ if "propose" in vars(c))


def drafter_metadata_builders(proposer: Any) -> list:
    """The attention-metadata builders of the drafter's layers."""
    groups = getattr(proposer, "draft_attn_groups", None)
    if groups is not None:  # 0.20+
        return [g.get_metadata_builder() for g in groups]
    builder = getattr(proposer, "attn_metadata_builder", None)  # 0.16
    return [builder if builder is not None else proposer._get_attention_metadata_builder()]
