"""Runs inside vLLM workers (via LLM.apply_model): record EAGLE-3 aux states."""


def install_recorder(model, layers):
    from vllm.model_executor.models.interfaces import supports_eagle3

    # the same check vLLM's GPU model runner makes before asking for aux states
    assert supports_eagle3(model), f"{type(model).__name__} does not satisfy SupportsEagle3"
    model.set_aux_hidden_state_layers(tuple(layers))
    inner = model.forward

    def forward(*args, **kwargs):
        out = inner(*args, **kwargs)
        hidden, aux = out  # the patched target returns (hidden, aux)
        model._k2_captured.append([t.detach().clone() for t in aux])
        return hidden

    model._k2_captured = []
    model.forward = forward
    return True


def take_captured(model):
    out, model._k2_captured = model._k2_captured, []
    return out
