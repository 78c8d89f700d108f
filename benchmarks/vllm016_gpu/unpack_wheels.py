"""Unpack the named wheels (NAME==VERSION) from a download folder into one site folder, as
``pip install --target`` lays them out (purelib/platlib data folded in; scripts, headers
and static ``.a`` archives dropped: nothing loads them at run time; DROP below).

    python unpack_wheels.py WHEEL_DIR SITE_DIR transformers==4.57.6 ...

A name with no wheel, or with two, is an error naming it: nothing is skipped silently.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

#: Package data no process of a DeepSeek/Kimi engine reads, left out to fit a device call (64 MiB):
#: Mistral's tokenizer files (read only when a Mistral tokenizer is loaded; vLLM 0.16 imports the
#: package at start for type checks) and pycountry's translations (gettext, only when asked).
DROP = ("mistral_common/data/", "pycountry/locales/")


def _stem(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_for(folder: Path, spec: str) -> Path:
    name, version = spec.split("==")
    want = [_stem(name), _stem(version)]
    found = [w for w in folder.glob("*.whl") if [_stem(x) for x in w.name.split("-")[:2]] == want]
    if len(found) != 1:
        raise SystemExit(f"unpack_wheels: {spec}: {len(found)} wheels in {folder} ({[w.name for w in found]})")
    return found[0]


def unpack(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            data = re.match(r"[^/]+\.data/(purelib|platlib)/(.*)", name)
            if data:
                name = data.group(2)
            elif re.match(r"[^/]+\.data/", name) or name.endswith(("/", ".a")) or name.startswith(DROP):
                continue  # scripts, headers and static archives (link-time only: xgrammar ships a 50 MB one)
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                out.write(src.read())
            dest.chmod(0o755 if ".so" in dest.name else 0o644)


def main(argv: list[str]) -> None:
    folder, site, specs = Path(argv[0]), Path(argv[1]), argv[2:]
    wheels = [wheel_for(folder, s) for s in specs]  # every name resolved before anything is written
    for w in wheels:
        unpack(w, site)


if __name__ == "__main__":
    main(sys.argv[1:])
