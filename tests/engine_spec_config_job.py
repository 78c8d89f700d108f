"""Engine-config job: build vLLM's config for target + EAGLE-3 drafter, optionally
load the drafter through vLLM's own model loader, and report what vLLM built.

    python tests/engine_spec_config_job.py JOB.json RESULT.json

For vLLM 0.16 on CPU, where the engine cannot run speculative decoding: this is
as far as the real engine goes (config validation + drafter class + weights).
"""

import json
import sys
import tempfile
import traceback

_DIST = False


def load_draft(cfg):
    global _DIST
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader import get_model

    if not _DIST:
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{tempfile.mktemp()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        _DIST = True
    with set_current_vllm_config(cfg), torch.device("cpu"):
        model = get_model(vllm_config=cfg, model_config=cfg.speculative_config.draft_model_config)
    params = dict(model.named_parameters())
    return {
        "class": f"{type(model).__module__}.{type(model).__name__}",
        "d2t": model.draft_id_to_target_id.tolist(),
        "fc_shape": list(model.model.fc.weight.shape),
        "lm_head_shape": list(model.lm_head.weight.shape),
        "has_own_embed_tokens": bool(getattr(model, "has_own_embed_tokens", True)),
        "param_names": sorted(params),
        # float64 sums of what the loader put in each parameter (the test sets them beside the checkpoint's)
        "param_sums": {n: float(p.detach().double().sum()) for n, p in params.items()},
        # and of each parameter's first half of rows (a fused parameter: which shard went where)
        "param_first_half_sums": {
            n: float(p.detach().double()[: p.shape[0] // 2].sum()) for n, p in params.items() if p.dim() > 0
        },
    }


def one(job, draft_dir):
    result = {"ok": False}
    try:
        from vllm.engine.arg_utils import EngineArgs

        spec = {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": 3}
        cfg = EngineArgs(model=job["model"], speculative_config=spec, **job["engine"]).create_engine_config()
        spec = cfg.speculative_config
        hf = spec.draft_model_config.hf_config
        result.update(
            method=spec.method,
            draft_architectures=list(hf.architectures or []),
            aux_layer_ids=getattr(hf, "eagle_aux_hidden_state_layer_ids", None),
            target_hidden_size=getattr(hf, "target_hidden_size", None),
        )
        if job.get("load_draft"):
            result["draft"] = load_draft(cfg)
        result["ok"] = True
    except BaseException as e:  # noqa: BLE001
        result.update(error_type=type(e).__name__, error=str(e), traceback=traceback.format_exc())
    return result


def main(job_path, result_path):
    job = json.load(open(job_path))
    results = {d: one(job, d) for d in job["drafts"]}
    json.dump(results, open(result_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
