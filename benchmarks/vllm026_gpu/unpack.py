"""Unpack the vLLM 0.26 bundle (.gpub026) into a site directory, as pip --target lays it out:
the dependencies and vLLM's Python tree, then each kernel library where vLLM loads it.

    python3 benchmarks/vllm026_gpu/unpack.py SITE BUNDLE
"""

import glob
import lzma
import os
import shutil
import sys
import tarfile


def unpack(site: str, bundle: str) -> None:
    for part in ("deps", "src"):
        with tarfile.open(f"{bundle}/{part}.tar.xz") as tf:
            tf.extractall(site, filter="data")
    for f in glob.glob(f"{bundle}/so/*.so.xz"):
        name = os.path.basename(f)[:-3]
        dst = os.path.join(site, "vllm", "vllm_flash_attn" if "fa3" in name else "", name)
        with lzma.open(f) as i, open(dst, "wb") as o:
            shutil.copyfileobj(i, o, 1 << 24)
        os.chmod(dst, 0o755)


if __name__ == "__main__":
    unpack(*sys.argv[1:3])
