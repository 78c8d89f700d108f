"""Runs inside vLLM workers (via LLM.apply_model): record EAGLE-3 aux states."""


def install_recorder(model, layers):
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
