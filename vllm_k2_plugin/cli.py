"""`vllm-k2`: thin command line; each subcommand calls into its feature."""

from __future__ import annotations

import argparse
import json
import sys


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import collect, render

    report = collect()
    print(json.dumps(report, indent=1) if args.json else render(report))
    failed = [p["name"] for p in report["patches"] if p["state"] == "failed"]
    return 1 if failed and args.strict else 0


def _patches_list(args: argparse.Namespace) -> int:
    from .doctor import render_patch_table
    from .features import load_feature_patches
    from .patching import REGISTRY
    from .settings import Settings

    load_feature_patches(Settings.from_env().extra_patch_modules)
    if args.apply:
        import vllm_k2_plugin

        vllm_k2_plugin.register()
    rows = [p.describe() for p in REGISTRY]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(render_patch_table(rows, verbose=True))
    return 0


def _fixture(args: argparse.Namespace) -> int:
    from .fixtures import build_fixture

    path = build_fixture(args.kind, args.out, force=args.force)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-k2", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="versions, GPU, and the state of every patch")
    d.add_argument("--json", action="store_true")
    d.add_argument("--strict", action="store_true", help="exit 1 if any patch failed")
    d.set_defaults(func=_doctor)

    pa = sub.add_parser("patches", help="the patch registry")
    psub = pa.add_subparsers(dest="patches_command", required=True)
    pl = psub.add_parser("list", help="every patch: target, versions, upstream, removal")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--apply", action="store_true", help="also apply them here and show the resulting states")
    pl.set_defaults(func=_patches_list)

    f = sub.add_parser("fixture", help="write a tiny Kimi-K2.5-architecture model")
    f.add_argument("kind", choices=["text", "k25"], help="text: DeepSeek-V3 LM; k25: K2.5 wrapper")
    f.add_argument("out", help="output directory")
    f.add_argument("--force", action="store_true", help="rebuild even if present")
    f.set_defaults(func=_fixture)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
