"""The vllm-0.34.0 series (GPU runtime patches staged for upstream, ported to PyPI's newest
vLLM): applies to a copy of the installed 0.34 package, reverts byte-identically, and each
file flips its runtime twin's own upstream probe (stock 0.34: False). No GPU and no engine:
the probes stand in for the CUDA ops (recorders) and, for the Triton attention builder,
for a CUDA platform with an H200's SM count."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_k2_plugin.patching import files

from .conftest import REPO, engine_env

pytestmark = pytest.mark.vllm034
VERSION = "0.34.0"
TWINS = (
    "rope-float32-cache",
    "moe-group-tokens-by-expert",
    "draft-attention-segments",
    "tp-pcie-oneshot-allreduce",
    "spec-guard-no-draft-rpc",
    "draft-attention-tile",
    "spec-guard",
)
#: 0004's opt-in (bytes) and 0007's: the probe runs see them set, so stock answers False despite them.
PCIE_OPT_IN = {
    "VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE": str(64 * 1024),
    "VLLM_SPEC_DECODE_GUARD": "1",
    "VLLM_K2_PCIE_ALLREDUCE": "1",
}
#: Rows of a one-KV-head decode batch (8 query heads, scratch of 16 rows x 16 segments).
ROWS = (1, 2, 4, 8, 9, 16, 17)
H200_SMS = 132
PROBE = r"""
import json
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
import torch
import vllm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.platforms import current_platform
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder as Builder
from vllm_k2_plugin.comm.patch import _upstream_takes_pcie_ranks
from vllm.v1.attention.ops import triton_unified_attention as _ops
from vllm_k2_plugin.draft_attention.segments import _upstream_fills_the_gpu, widen
from vllm_k2_plugin.draft_attention.tile import _upstream_tiles_wider
from vllm_k2_plugin.moe_verify.patch import _upstream_sorts_small_batches
from vllm_k2_plugin.patching import REGISTRY
from vllm_k2_plugin.rope_cache.patch import _upstream_hands_float_cache
from vllm_k2_plugin.spec_guard.no_draft_rpc import _upstream_skips_rpc
from vllm_k2_plugin.spec_guard.patch import _upstream_adapts_k

from tests.gpu_patch_probes import moe_assignment, rope_cache_handed

ROWS, SMS = json.loads(sys.argv[1])


def segments(twin):
    # one-KV-head decode batches of ROWS rows at 32k: build's segment count, or (twin)
    # the runtime twin's rule applied to build's metadata for SMS SMs
    out = []
    for rows in ROWS:
        b = Builder.__new__(Builder)
        b.device, b.seq_threshold_3D, b.num_par_softmax_segments = torch.device("cpu"), 16, 16
        b.num_heads_kv, b.num_heads_q, b.max_seqs_64_segments, b.rswa_window = 1, 8, 0, None
        b.softmax_segm_output = torch.empty(16, 8, 16, 128)
        b.softmax_segm_max = torch.empty(16, 8, 16)
        b.softmax_segm_expsum = torch.empty(16, 8, 16)
        i32 = dict(dtype=torch.int32)
        common = CommonAttentionMetadata(
            query_start_loc=torch.arange(rows + 1, **i32),
            query_start_loc_cpu=torch.arange(rows + 1, **i32),
            seq_lens=torch.full((rows,), 32768, **i32),
            num_reqs=rows,
            num_actual_tokens=rows,
            max_query_len=1,
            max_seq_len=32768,
            block_table_tensor=torch.zeros(rows, 2048, **i32),
            slot_mapping=torch.arange(rows),
        )
        meta = Builder.build(b, 0, common)
        if twin:
            widen(b, meta, SMS)
        s = int(meta.num_par_softmax_segments)
        assert meta.softmax_segm_output.shape[2] == meta.softmax_segm_max.shape[2] == s
        out.append(s)
    return out


result = {
    "vllm_from": vllm.__file__,
    "rope_float32_cache": _upstream_hands_float_cache(),
    "moe_sorts_batches": _upstream_sorts_small_batches(),
    "moe_assignment": moe_assignment(),
    "rope_cache_handed": rope_cache_handed(),
    "segments_no_gpu": _upstream_fills_the_gpu(),
    "pcie_takes_ranks": _upstream_takes_pcie_ranks(),
    "no_draft_rpc": _upstream_skips_rpc(),
    "tiles_wider": _upstream_tiles_wider(),
    "adapts_k": _upstream_adapts_k(),
    # the decode tile for: head 128 bf16, prefill, fp8, a sliding window, head 256
    "tiles": [_ops._get_tile_size(*a, is_prefill=p) for a, p in
              (((128, 0, 2), False), ((128, 0, 2), True), ((128, 0, 1), False), ((128, 4096, 2), False),
               ((256, 0, 2), False))],
    "states": {p.name: p.state.value for p in REGISTRY},
}
# The segments probe builds on the CPU; what a CUDA platform with SMS SMs would answer:
current_platform.is_cuda_alike = lambda: True
current_platform.num_compute_units = lambda device_id=0: SMS
result["fills_the_gpu"] = _upstream_fills_the_gpu()
result["segments_build"] = segments(twin=False)
result["segments_twin"] = segments(twin=True)
print(json.dumps(result))
"""


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "patches", *args],
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _probe(env):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([ROWS, H200_SMS])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory):
    import vllm

    site = tmp_path_factory.mktemp("site34")
    shutil.copytree(Path(vllm.__file__).parent, site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_series_covers_the_gpu_patches():
    series = files.load_series(VERSION)
    assert [p.name for p in series] == [f"{i:04d}-{twin}.patch" for i, twin in enumerate(TWINS, 1)]
    for p, twin in zip(series, TWINS, strict=True):
        assert p.header["Runtime twin"].startswith(twin + " ")
        assert {"Title", "Why", "Changes", "Upstream", "Remove when"} <= set(p.header)


def test_apply_check_revert_on_installed_copy(patched_site, tmp_path):
    tree = tmp_path / "vllm"
    series = files.load_series(VERSION)
    created = files._created(series)  # 0007's new module: absent before, gone after revert
    touched = [rel for rel in files._all_files(series) if rel not in created]
    assert created == {"v1/core/sched/spec_guard.py"}
    for rel in touched + ["_version.py"]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(patched_site / "vllm" / rel, tree / rel)
    before = {rel: (tree / rel).read_bytes() for rel in touched}
    check = _cli("check", "--vllm-root", str(tree)).stdout
    assert "not applied" in check and "conflicting" not in check, check
    applied = _cli("apply", "--vllm-root", str(tree))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert _cli("apply", "--vllm-root", str(tree)).stdout.strip() == "already applied (no change)"
    assert {rel: (tree / rel).read_bytes() for rel in touched} != before
    assert all((tree / rel).is_file() for rel in created)
    assert _cli("revert", "--vllm-root", str(tree)).returncode == 0
    assert {rel: (tree / rel).read_bytes() for rel in touched} == before
    assert not any((tree / rel).exists() for rel in created)


def test_patch_files_flip_their_twins_probes(patched_site):
    applied = _cli("apply", "--vllm-root", str(patched_site / "vllm"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched_path = os.pathsep.join([str(patched_site), str(REPO)])
    # The probe builds no model, so the runtime twin's model gate has no config to ask: opt in.
    runtime = _probe(engine_env(**PCIE_OPT_IN, VLLM_K2_ANY_MODEL="1"))
    files_only = _probe(engine_env(PYTHONPATH=patched_path, VLLM_K2_DISABLE_PATCHES=",".join(TWINS), **PCIE_OPT_IN))
    stock = _probe(engine_env(VLLM_K2_DISABLE="1", **PCIE_OPT_IN))
    assert files_only.pop("vllm_from").startswith(str(patched_site))
    assert not runtime.pop("vllm_from").startswith(str(patched_site))
    stock.pop("vllm_from")

    # Each twin's own upstream probe: False on stock 0.34, True with the files (twins off).
    probes = (
        "rope_float32_cache",
        "moe_sorts_batches",
        "fills_the_gpu",
        "pcie_takes_ranks",
        "no_draft_rpc",
        "tiles_wider",
        "adapts_k",
    )
    assert {k: stock[k] for k in probes} == dict.fromkeys(probes, False)
    assert {k: files_only[k] for k in probes} == dict.fromkeys(probes, True)
    # without a CUDA-alike platform the file's build keeps stock's 16 segments
    assert stock["segments_no_gpu"] is files_only["segments_no_gpu"] is False

    # moe: the file assigns like the runtime twin (stock: unsorted up to 12 tokens x top 8 of 384).
    assert runtime["states"]["moe-group-tokens-by-expert"] == "applied"
    # pcie: stock with the opt-ins set keeps the twin (it ignores the settings); the runtime
    # spec guard is off on 0.34 as a whole (built for the v1 model runner; 0.34 has only V2)
    assert runtime["states"]["tp-pcie-oneshot-allreduce"] == "applied"
    assert runtime["states"]["spec-guard"] == "not-applicable"
    assert runtime["moe_assignment"] == files_only["moe_assignment"] == ["naive"] + ["sorted"] * 4
    assert stock["moe_assignment"] == ["naive"] * 4 + ["sorted"]
    # rope: the op gets one float32 copy of the bf16 cache, the same values (the twin's cache.float()).
    assert files_only["rope_cache_handed"] == {"dtype": "torch.float32", "made_once": True, "same_values": True}
    assert stock["rope_cache_handed"]["dtype"] == "torch.bfloat16"
    # segments: build gives the counts the twin's rule gives stock's metadata, on an H200's SMs.
    assert stock["segments_build"] == [16] * len(ROWS)
    # rows 1, 2, 4, 8 widen (several rows: two waves of the 132 SMs), 9+ stay stock
    assert files_only["segments_build"] == stock["segments_twin"] == [128, 128, 64, 32, 16, 16, 16]
    assert files_only["segments_twin"] == files_only["segments_build"]  # the twin adds nothing on top
    # tile: 128 keys for plain 16-bit decodes at head <= 128 only (the twin's measured choice, unmeasured)
    assert stock["tiles"] == [16, 32, 32, 16, 16]
    assert files_only["tiles"] == [128, 32, 32, 16, 16]


#: vLLM 0.34's CustomAllreduce built on 8 PCIe-only ranks of one node (threads of one
#: process, no GPU): the CPU group's collectives and the kernel are stood in for (the
#: kernel: a float32 sum of every rank's input; faults: rank 0 loses rank 7's values, or
#: rounds its result toward zero: within bf16 rounding, but not the other ranks' bits).
#: Per case (opt-in bytes or None, fault): what __init__ left, what should_custom_ar admits.
PCIE_PROBE = r"""
import json
import os
import sys
import threading

import torch
import vllm.distributed.device_communicators.custom_all_reduce as car
from vllm.platforms import current_platform

from vllm_k2_plugin.comm.patch import _upstream_takes_pcie_ranks

WORLD, KIB = 8, 1024


class Ranks:
    def __init__(self, fault):
        self.barrier = threading.Barrier(WORLD, timeout=60)  # a failing rank must not hang the rest
        self.local, self.slots, self.fault = threading.local(), [None] * WORLD, fault
        self.cpp_fully_connected, self.warnings = [], []
        self.Backend = torch.distributed.Backend

    def _exchange(self, obj):
        self.barrier.wait()
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    # torch.distributed as the module uses it (a CPU group)
    def get_backend(self, group=None):
        return "gloo"

    def get_rank(self, group=None):
        return self.local.rank

    def get_world_size(self, group=None):
        return WORLD

    def all_gather(self, out, tensor, group=None):
        for o, t in zip(out, self._exchange(tensor.clone()), strict=True):
            o.copy_(t)

    def all_gather_object(self, out, obj, group=None):
        out[:] = self._exchange(obj)

    # vllm._custom_ops as the module uses it
    def meta_size(self):
        return 0

    def init_custom_ar(self, meta, rank_data, rank, fully_connected):
        self.cpp_fully_connected.append(fully_connected)
        return 1

    def register_buffer(self, ptr, ptrs):
        pass

    def dispose(self, ptr):
        pass

    def all_reduce(self, ptr, inp, out, buf, size):
        inputs = self._exchange(inp.float().clone())
        if self.fault == "drop" and self.local.rank == 0:
            inputs = inputs[:-1]
        total = torch.stack(inputs).sum(0)
        if self.fault == "truncate" and self.local.rank == 0:  # within bf16 rounding, other bits
            total = (total.view(torch.int32) & -65536).view(torch.float32)
        out.copy_(total.to(torch.bfloat16))


def build(opt_in, fault):
    os.environ.pop("VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE", None)
    if opt_in is not None:
        os.environ["VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE"] = str(opt_in)
    g = Ranks(fault)
    car.dist, car.ops, car.custom_ar = g, g, True
    car.in_the_same_node_as = lambda group, source_rank=0: [True] * WORLD
    car._can_p2p = lambda rank, world: True
    car._supports_mnnvl_multimem_reduce_scatter = lambda device, world: False
    car._all_ranks_true = lambda group, value: value
    car.CustomAllreduce.create_shared_buffer = staticmethod(lambda *a, **k: [0] * WORLD)
    car.CustomAllreduce.free_shared_buffer = staticmethod(lambda *a, **k: None)
    car.logger.warning = lambda msg, *a, **k: g.warnings.append(msg % a if a else msg)
    for name, value in dict(is_cuda_alike=True, is_cuda=False, is_rocm=False, is_fully_connected=False).items():
        setattr(current_platform, name, lambda *a, _v=value, **k: _v)  # NVML: PCIe only
    current_platform.get_device_capability = lambda *a, **k: None
    current_platform.visible_device_id_to_physical_device_id = lambda i: g.local.rank
    torch.cuda.synchronize = lambda *a, **k: None
    made, errors = [None] * WORLD, []

    def rank(r):
        g.local.rank = r
        try:
            made[r] = car.CustomAllreduce(group=None, device=torch.device("cpu"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
            g.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ca = made[0]
    admits = [kib for kib in (14, 56, 224, 448) if not ca.disabled and ca.should_custom_ar(
        torch.empty(kib * KIB // 2, dtype=torch.bfloat16))]
    return {
        "enabled": sorted({not c.disabled for c in made}),
        "cpp_fully_connected": sorted(set(g.cpp_fully_connected)),
        "python_fully_connected": sorted({getattr(c, "fully_connected", None) for c in made}, key=str),
        "admits_kib": admits,
        "warnings": sorted(set(g.warnings)),
        "probe": _upstream_takes_pcie_ranks(),
    }


print(json.dumps([build(opt_in, fault) for opt_in, fault in json.loads(sys.argv[1])]))
"""
PCIE_CASES = [(None, None), (64 * 1024, None), (4 << 20, None), (64 * 1024, "drop"), (64 * 1024, "truncate")]


def _pcie(env) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-c", PCIE_PROBE, json.dumps(PCIE_CASES)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pcie_allreduce_file_on_eight_pcie_ranks(patched_site):
    """0004 on vLLM's own __init__ and gate: off unless opted in; opted in, the C++ side
    launches for 8 ranks, the Python side keeps fully_connected False, sizes below the
    opt-in (capped at the one-stage kernel's 256 KiB) go custom; a start-up check that
    sees a wrong sum or ranks that disagree leaves all 8 on NCCL."""
    applied = _cli("apply", "--vllm-root", str(patched_site / "vllm"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    off, small, capped, dropped, truncated = _pcie(
        engine_env(PYTHONPATH=os.pathsep.join([str(patched_site), str(REPO)]), VLLM_K2_DISABLE="1")
    )
    stock = _pcie(engine_env(VLLM_K2_DISABLE="1"))

    # stock 0.34: NCCL only, opt-in or not; its gate's warning
    assert all(c["enabled"] == [False] and c["admits_kib"] == [] and not c["probe"] for c in stock)
    assert all(c["cpp_fully_connected"] == [] for c in stock)
    assert "not supported on more than two PCIe-only GPUs" in stock[1]["warnings"][0]
    # the file without the opt-in: as stock (and the twin's probe keeps the twin)
    assert (off["enabled"], off["admits_kib"], off["cpp_fully_connected"], off["probe"]) == ([False], [], [], False)
    assert "VLLM_CUSTOM_ALLREDUCE_PCIE_MAX_SIZE opts in" in off["warnings"][0]
    # opted in and checked: every rank on, below the opt-in / the one-stage cap
    for case, admits in ((small, [14, 56]), (capped, [14, 56, 224])):
        assert case["enabled"] == [True] and case["warnings"] == [] and case["probe"] is True
        assert case["cpp_fully_connected"] == [True] and case["python_fully_connected"] == [False]
        assert case["admits_kib"] == admits
    # a wrong start-up all-reduce: every rank back on NCCL, saying why
    for case, why in (
        (dropped, "values off the sum on (rank, count) [(0, "),
        (truncated, "ranks disagree on the result"),
    ):
        assert case["enabled"] == [False] and case["admits_kib"] == [], case
        assert len(case["warnings"]) == 1 and why in case["warnings"][0], case["warnings"]


#: vLLM 0.34's own Scheduler on a tiny Llama config (no weights, no GPU), n-gram speculation:
#: argv[1] the model directory, argv[2] JSON {"k", "per_batch" (a dynamic schedule or null),
#: "max_len"}. The scheduler probes below start with it.
TINY_SCHEDULER = r"""
import json
import sys
import time
from types import SimpleNamespace

import torch
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                         SpeculativeConfig, VllmConfig)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

args = json.loads(sys.argv[2])
max_len, blocks = args["max_len"], args["max_len"] // 8
model = ModelConfig(model=sys.argv[1], skip_tokenizer_init=True, dtype="float32", max_model_len=max_len)
spec = SpeculativeConfig(
    method="ngram", num_speculative_tokens=args["k"], prompt_lookup_max=2, prompt_lookup_min=1,
    num_speculative_tokens_per_batch_size=[tuple(t) for t in args["per_batch"]] if args["per_batch"] else None,
    target_model_config=model, target_parallel_config=ParallelConfig(),
)
config = VllmConfig(
    model_config=model, speculative_config=spec, device_config=DeviceConfig(device="cpu"),
    scheduler_config=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=max_len, max_model_len=max_len,
                                     is_encoder_decoder=False),
    cache_config=CacheConfig(block_size=16),
)
config.cache_config.num_gpu_blocks = blocks
spec_kv = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec_kv)])
scheduler = Scheduler(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                      block_size=16, log_stats=False)
"""


def _scheduler_probe(script, env, model_dir, k, per_batch, max_len, *argv):
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            TINY_SCHEDULER + script,
            str(model_dir),
            json.dumps({"k": k, "per_batch": per_batch, "max_len": max_len}),
            *argv,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


#: With a dynamic speculative decoding schedule of K = 0 at batch 1 and K = 2 at 2-4, and
#: EngineCore's post_step on a bare synchronous core around it (the executor a recorder).
#: Per step: the K scheduled, the scheduler's record, the executor calls post_step made and
#: the drafts the step's requests then hold.
RPC_PROBE = r"""

class Executor:
    def __init__(self):
        self.calls = 0

    def take_draft_token_ids(self):  # what the worker would answer: stale drafts, visibly not empty
        self.calls += 1
        ids = list(scheduler.requests)
        return DraftTokenIds(ids, [[7, 7] for _ in ids])


core = EngineCore.__new__(EngineCore)
core.scheduler, core.model_executor = scheduler, Executor()
core.check_for_draft_tokens, core.async_scheduling, core.batch_queue = True, False, None
steps = []
for new in (["a"], ["b", "c"]):
    for rid in new:
        scheduler.add_request(Request(request_id=rid, prompt_token_ids=[1, 2, 3, 4],
                                      sampling_params=SamplingParams(max_tokens=8), pooling_params=None))
    out = scheduler.schedule()
    record = getattr(scheduler, "draftless_req_ids", "absent")
    before = core.model_executor.calls
    core.post_step(model_executed=True)
    steps.append({
        "k": out.num_spec_tokens_to_schedule,
        "record": record,
        "executor_calls": core.model_executor.calls - before,
        "drafts": {rid: scheduler.requests[rid].spec_token_ids for rid in out.num_scheduled_tokens},
    })
print(json.dumps(steps))
"""
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def _rpc(env, model_dir) -> list[dict]:
    return _scheduler_probe(RPC_PROBE, env, model_dir, 2, [(1, 1, 0), (2, 4, 2)], 256)


def test_no_draft_rpc_file_on_vllms_scheduler(patched_site, tmp_path):
    """0005 on vLLM 0.34's own Scheduler and post_step: a step the schedule runs at K = 0
    is recorded and gets its empty drafts without an executor call; a K = 2 step asks the
    worker as stock does. Stock asks after both."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    applied = _cli("apply", "--vllm-root", str(patched_site / "vllm"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched_env = engine_env(PYTHONPATH=os.pathsep.join([str(patched_site), str(REPO)]), VLLM_K2_DISABLE="1")
    k0, k2 = _rpc(patched_env, tmp_path)
    stock = _rpc(engine_env(VLLM_K2_DISABLE="1"), tmp_path)

    assert [s["k"] for s in stock] == [k0["k"], k2["k"]] == [0, 2]
    assert [s["record"] for s in stock] == ["absent", "absent"]
    assert [s["executor_calls"] for s in stock] == [1, 1]
    assert stock[0]["drafts"] == {"a": [7, 7]}  # the worker's answer, stored
    assert (k0["record"], k0["executor_calls"], k0["drafts"]) == (["a"], 0, {"a": []})
    assert (k2["record"], k2["executor_calls"]) == (None, 1)
    assert set(k2["drafts"]) == {"b", "c"} and all(d == [7, 7] for d in k2["drafts"].values())


#: With n-gram k = 3 and one request whose drafts are all rejected (argv[3] "none": one
#: sampled token per step) or all accepted ("all"), each step's verify made to cost more with
#: k (a sleep between schedule() and update_from_output()): per step, the K the scheduler
#: scheduled, and its guard.
GUARD_PROBE = r"""
scheduler.add_request(Request(request_id="r", prompt_token_ids=[1, 2, 3, 4],
                              sampling_params=SamplingParams(max_tokens=1000, ignore_eos=True), pooling_params=None))
ks = []
for _ in range(150):
    out = scheduler.schedule()
    k = out.num_spec_tokens_to_schedule
    ks.append(k)
    drafts = list(out.scheduled_spec_decode_tokens.get("r", ()))
    time.sleep(0.002 * (1 + 0.5 * len(drafts)))
    sampled = (drafts if sys.argv[3] == "all" else []) + [5]
    scheduler.update_from_output(out, ModelRunnerOutput(req_ids=["r"], sampled_token_ids=[sampled]))
    scheduler.update_draft_token_ids(DraftTokenIds(["r"], [[7] * k]))  # what a drafter proposes at K
print(json.dumps({"ks": ks, "guard": type(getattr(scheduler, "spec_guard", None)).__name__}))
"""


def _guard(env, model_dir, accepted) -> dict:
    return _scheduler_probe(GUARD_PROBE, env, model_dir, 3, None, 1024, accepted)


def test_spec_guard_file_on_vllms_scheduler(patched_site, tmp_path):
    """0007 on vLLM 0.34's own Scheduler: switched on, drafts never accepted and verify
    costing more than a plain step, the scheduled K falls from 3 to 0 (short probes of a
    k > 0 aside); every draft accepted, it stays at 3 (short probes of k = 0 aside); not
    switched on, the patched scheduler keeps K = 3 as stock does."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 1024}))
    applied = _cli("apply", "--vllm-root", str(patched_site / "vllm"))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    path = os.pathsep.join([str(patched_site), str(REPO)])
    on, off = (engine_env(PYTHONPATH=path, VLLM_K2_DISABLE="1", VLLM_SPEC_DECODE_GUARD=v) for v in "10")
    loses, pays, stock = _guard(on, tmp_path, "none"), _guard(on, tmp_path, "all"), _guard(off, tmp_path, "none")
    assert (loses["guard"], pays["guard"], stock["guard"]) == ("SchedulerSpecGuard",) * 2 + ("NoneType",)
    assert stock["ks"] == [3] * 150
    assert loses["ks"][:8] == pays["ks"][:8] == [3] * 8  # warm-up at full k
    assert loses["ks"][-100:].count(0) >= 90, loses["ks"]  # off, but for probes of one draft
    assert set(loses["ks"][-100:]) <= {0, 1}
    assert pays["ks"].count(3) >= 135 and set(pays["ks"]) == {0, 3}, pays["ks"]  # k = 0 only as a probe
