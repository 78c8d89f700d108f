"""Atomic file and directory writes (a reader sees the old version or the new one, never
half of one: a killed stage must not leave a file that looks complete) and file digests.
Shared by the runtime (traces, patch files) and the tools (fixtures, training, benchmarks)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager


def write_file(path: str, write: Callable[[str], None]) -> None:
    """Call write(tmp_path) next to `path`, fsync, then rename over `path`."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str, obj) -> None:
    write_text(path, json.dumps(obj, indent=1))


def write_text(path: str, text: str) -> None:
    def _w(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    write_file(path, _w)


def copy(src: str, dst: str) -> None:
    """shutil.copy2 (data, mode, times), atomically replacing dst."""
    write_file(dst, lambda tmp: shutil.copy2(src, tmp))


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def update_json(path: str, change: Callable[[dict], dict]) -> dict:
    """Read the JSON object at `path` ({} if absent), write change(it) atomically and return
    it, all under an exclusive lock on `path`.lock: processes that update one file (ranks
    recording the shards each verified) never lose each other's updates."""
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        new = change(read_json(path) if os.path.exists(path) else {})
        write_json(path, new)
        return new


@contextmanager
def directory(path: str):
    """Yield a temp dir beside `path`; on success it replaces `path` whole."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}-", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}-old-", dir=parent)
            os.replace(path, os.path.join(old, "x"))
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


#: Names of this module's temporaries: write_file's ".tmp-XXXXXXXX<name>", directory()'s
#: ".<name>-XXXXXXXX" and ".<name>-old-XXXXXXXX" (XXXXXXXX: tempfile's 8 random characters).
_TEMP = re.compile(r"^\.(tmp-[a-z0-9_]{8}.+|.+-(old-)?[a-z0-9_]{8})$")


def leftovers(path: str) -> list[str]:
    """Temporaries of this module under `path` (recursively): what an interrupted or buggy
    write left behind. Empty after every successful write."""
    found = []
    for root, dirs, files in os.walk(path):
        found += [os.path.relpath(os.path.join(root, n), path) for n in dirs + files if _TEMP.match(n)]
    return sorted(found)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
