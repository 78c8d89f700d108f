"""Versioned patch files: `patches/vllm-<version>/series` + one unified diff each.

``vllm-k2 patches apply|check|revert|export`` on an installed vLLM (or any vLLM
source tree via --vllm-root). Paths inside the diffs are relative to the ``vllm/``
package. Applying is all-or-nothing: the whole series is applied to a staging copy
of the touched files with GNU patch, and only if every patch succeeds are the
originals backed up and the patched files swapped in (each atomically). State and
backups live in ``<vllm-root>/.vllm-k2-patches/``; ``revert`` restores the backups
byte for byte and refuses when a file changed after apply.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .. import fileio

#: Package data (the repository's top-level patches/ links here), so a wheel carries it.
PATCHES_ROOT = Path(str(resources.files("vllm_k2_plugin") / "patch_files"))
STATE_DIR = ".vllm-k2-patches"
_DIFF_FILE = re.compile(r"^\+\+\+ b/(\S+)", re.M)


class PatchFileError(RuntimeError):
    """A patch-file operation refused or failed; nothing was changed."""


@dataclass
class PatchFile:
    name: str
    path: Path
    header: dict[str, str]
    diff: str
    files: list[str] = field(default_factory=list)
    created: set[str] = field(default_factory=set)  # files the diff creates (@@ -0,0 ...)

    @property
    def title(self) -> str:
        return self.header.get("Title", self.name)


def _parse_header(text: str) -> dict[str, str]:
    header, key = {}, None
    for line in text.splitlines():
        m = re.match(r"^([A-Z][A-Za-z ]+):\s*(.*)$", line)
        if m:
            key = m.group(1)
            header[key] = m.group(2).strip()
        elif key and line.startswith("  "):
            header[key] += " " + line.strip()
    return header


def load_series(version: str, root: Path = PATCHES_ROOT) -> list[PatchFile]:
    folder = root / f"vllm-{version}"
    series = folder / "series"
    if not series.is_file():
        available = sorted(p.name for p in root.glob("vllm-*")) if root.is_dir() else []
        raise PatchFileError(f"no patch series for vLLM {version} ({series} missing; have {available})")
    out = []
    for name in (n.strip() for n in series.read_text().splitlines()):
        if not name or name.startswith("#"):
            continue
        path = folder / name
        text = path.read_text()
        head, sep, diff = text.partition("\n---\n")
        if not sep:
            raise PatchFileError(f"{path}: no '---' line between header and diff")
        files = _DIFF_FILE.findall(diff)
        if not files:
            raise PatchFileError(f"{path}: the diff names no files")
        created = set(re.findall(r"^\+\+\+ b/(\S+)\n@@ -0,0 ", diff, re.M))
        out.append(PatchFile(name, path, _parse_header(head), diff, files, created))
    return out


def installed_vllm_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        raise PatchFileError("vLLM is not installed (or pass --vllm-root)")
    return Path(spec.origin).parent


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_patch(cwd: Path, diff: str, *flags: str) -> subprocess.CompletedProcess:
    if shutil.which("patch") is None:
        raise PatchFileError("GNU patch is required (apt-get install patch)")
    return subprocess.run(
        # --forward: never "assume -R" on a reversed-looking patch; --fuzz=0: the
        # context must match exactly, so a tampered file is refused, not fuzzed.
        ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-r", "-", *flags],
        cwd=cwd,
        input=diff,
        capture_output=True,
        text=True,
    )


def _stage(root: Path, files: list[str], dst: Path, created: set[str] = frozenset()) -> None:
    for rel in files:
        src = root / rel
        if not src.is_file() and rel in created:
            continue  # the series creates it
        if not src.is_file():
            raise PatchFileError(f"{src}: file named by the series does not exist in this vLLM")
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst / rel)


def _all_files(series: list[PatchFile]) -> list[str]:
    return sorted({f for p in series for f in p.files})


def _created(series: list[PatchFile]) -> set[str]:
    return {f for p in series for f in p.created}


def _state_path(root: Path) -> Path:
    return root / STATE_DIR / "state.json"


def read_state(root: Path) -> dict | None:
    p = _state_path(root)
    return json.loads(p.read_text()) if p.is_file() else None


def check(root: Path, series: list[PatchFile]) -> dict[str, str]:
    """Per patch: applied / not applied / conflicting (dry runs on a staging copy,
    in series order, so later patches see earlier ones applied)."""
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        _stage(root, _all_files(series), stage, _created(series))
        for p in series:
            if _run_patch(stage, p.diff, "-R", "--dry-run").returncode == 0:
                result[p.name] = "applied"
            elif _run_patch(stage, p.diff, "--dry-run").returncode == 0:
                result[p.name] = "not applied"
                _run_patch(stage, p.diff)  # so the next patch sees it
            else:
                result[p.name] = "conflicting"
    return result


def apply(root: Path, version: str, series: list[PatchFile]) -> str:
    """Apply the whole series or nothing. Returns what happened."""
    state = read_state(root)
    files = _all_files(series)
    if state and state.get("applied"):
        current = {f: _sha(root / f) if (root / f).exists() else None for f in files}
        if current == state["patched"]:
            return "already applied (no change)"
        changed = sorted(f for f in files if current.get(f) != state["patched"].get(f))
        raise PatchFileError(f"{root}: files changed since the series was applied: {changed}; revert first")
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        _stage(root, files, stage, _created(series))
        for p in series:
            out = _run_patch(stage, p.diff)
            if out.returncode != 0:
                raise PatchFileError(
                    f"patch {p.name} does not apply to vLLM {version} at {root}; nothing was changed:\n"
                    + (out.stdout + out.stderr).strip()
                )
        backup = root / STATE_DIR / "backup"
        original = {f: _sha(root / f) if (root / f).exists() else None for f in files}
        for f in files:
            if original[f] is not None:
                (backup / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / f, backup / f)
        for f in files:
            fileio.copy(str(stage / f), str(root / f))
    _write_state(
        root,
        {
            "applied": True,
            "vllm_version": version,
            "series": [p.name for p in series],
            "original": original,
            "patched": {f: _sha(root / f) for f in files},
        },
    )
    return f"applied {len(series)} patches to {len(files)} files"


def revert(root: Path, force: bool = False) -> str:
    state = read_state(root)
    if not state or not state.get("applied"):
        return "nothing to revert (no series applied here)"
    backup = root / STATE_DIR / "backup"
    changed = [f for f, h in state["patched"].items() if not (root / f).exists() or _sha(root / f) != h]
    if changed and not force:
        raise PatchFileError(f"{root}: files changed after apply: {changed}; use --force to restore anyway")
    for f, h in state["original"].items():
        if h is not None and _sha(backup / f) != h:
            raise PatchFileError(f"{backup / f}: backup is damaged (hash mismatch); nothing was restored")
    for f, h in state["original"].items():
        if h is None:  # the series created it
            (root / f).unlink(missing_ok=True)
            continue
        fileio.copy(str(backup / f), str(root / f))
    shutil.rmtree(root / STATE_DIR)
    return f"restored {len(state['original'])} files"


def _write_state(root: Path, state: dict) -> None:
    fileio.write_json(str(_state_path(root)), state)


def export_git(series: list[PatchFile], out_dir: Path, author: str, date: str) -> list[Path]:
    """git format-patch style mbox files; paths rebased onto the vLLM repo (vllm/...)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    n = len(series)
    for i, p in enumerate(series, 1):
        body_keys = [k for k in p.header if k != "Title"]
        body = "\n\n".join(f"{k}: {p.header[k]}" for k in body_keys)
        diff = re.sub(r"^(---|\+\+\+) (a|b)/", r"\1 \2/vllm/", p.diff, flags=re.M)
        diff = "".join(_git_file_chunk(f, chunk) for f, chunk in _split_by_file(diff))
        text = (
            f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: {author}\nDate: {date}\nSubject: [PATCH {i}/{n}] {p.title}\n\n"
            f"{body}\n---\n{diff}--\nvllm-k2-plugin\n"
        )
        path = out_dir / f"{i:04d}-{re.sub(r'[^A-Za-z0-9]+', '-', p.title).strip('-')[:52]}.patch"
        path.write_text(text)
        written.append(path)
    return written


def _git_file_chunk(path: str, chunk: str) -> str:
    header = f"diff --git a/vllm/{path} b/vllm/{path}\n"
    if re.search(r"^@@ -0,0 ", chunk, re.M):  # a file the patch creates
        header += "new file mode 100644\n"
        chunk = re.sub(r"^--- a/\S+", "--- /dev/null", chunk, count=1, flags=re.M)
    return header + chunk


def _split_by_file(diff: str):
    """Yield (relative path, '--- ...\\n+++ ...\\n@@ ...') per file of a unified diff."""
    parts = re.split(r"(?=^--- a/)", diff, flags=re.M)
    for part in parts:
        m = re.search(r"^\+\+\+ b/vllm/(\S+)", part, re.M)
        if m:
            yield m.group(1), part


def version_of_tree(root: Path) -> str:
    """The release of the vLLM tree at root, read from its _version.py (no import)."""
    path = root / "_version.py"
    if not path.is_file():
        raise PatchFileError(f"{path}: not found; is {root} a vLLM package directory?")
    m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", path.read_text())
    if not m:
        raise PatchFileError(f"{path}: no __version__ found")
    from .versions import release_of

    return str(release_of(m.group(1)))
