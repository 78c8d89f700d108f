"""Worker extension: per-request capture of EAGLE-3 aux states through the model's own
SupportsEagle3 path (the plugin's backport on vLLM 0.16).

Differs from speculators 0.3.0's extension on purpose: no copy of the decoder loop
(it called ``get_input_embeddings``, gone in 0.16, and captured one layer late), the
model is resolved through ``get_language_model()`` (K2.5 wrapper), and captured rows
are keyed by request id using the runner's own batch layout, so batches of different
lengths and chunked prefills cannot mix samples up (speculators #279)."""

from __future__ import annotations

import torch


class HiddenStatesWorkerExtension:
    def _k2_setup_capture(self, layer_ids: list[int]) -> dict:
        from vllm.distributed import get_tp_group
        from vllm.model_executor.models.interfaces import supports_eagle3

        model = self.model_runner.model
        if not supports_eagle3(model):
            raise ValueError(f"{type(model).__name__} does not implement SupportsEagle3 (aux hidden states)")
        model.set_aux_hidden_state_layers(tuple(layer_ids))
        self._k2_capture = get_tp_group().rank_in_group == 0  # TP ranks hold identical states
        self._k2_rows: dict[str, list[list[torch.Tensor]]] = {}
        if getattr(model, "_k2_capturing", False):
            return {"layers": list(layer_ids)}
        inner = model.forward
        runner = self.model_runner

        def forward(*args, **kwargs):
            out = inner(*args, **kwargs)
            if not isinstance(out, tuple):  # intermediate pipeline rank or no aux requested
                return out
            hidden, aux = out
            if self._k2_capture:
                self._k2_store(runner, [*aux, hidden])
            return hidden

        model.forward = forward
        model._k2_capturing = True
        return {"layers": list(layer_ids)}

    def _k2_store(self, runner, states: list[torch.Tensor]) -> None:
        batch = runner.input_batch
        n = batch.num_reqs
        starts = runner.query_start_loc.np[: n + 1].tolist()
        for i, req_id in enumerate(batch.req_ids[:n]):
            a, b = starts[i], starts[i + 1]
            chunk = [s[a:b].detach().to("cpu", copy=True) for s in states]
            self._k2_rows.setdefault(req_id, []).append(chunk)

    def _k2_reset_capture(self) -> None:
        self._k2_rows = {}

    def _k2_get_captured(self) -> dict[str, list[torch.Tensor]]:
        """req_id -> one tensor per captured state, prefill chunks concatenated in order."""
        out = {
            req: [torch.cat([chunk[j] for chunk in chunks]) for j in range(len(chunks[0]))]
            for req, chunks in self._k2_rows.items()
        }
        self._k2_rows = {}
        return out
