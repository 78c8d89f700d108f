"""The `vllm-k2` subcommands that come with the tools: `train`, `bench`, `fixture`.

The runtime's command line (vllm_k2_plugin/cli.py) adds them through :func:`add_parsers`
when this package is installed; each calls into its tool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


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
        print(
            f"vllm-k2 bench ab: error: --mode: more than one mode named {', '.join(twice)}; "
            "name them with NAME={json}",
            file=sys.stderr,
        )
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
    from .mla_bench.bench import main as bench_mla

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


def add_parsers(sub) -> None:
    """Add `bench`, `train` and `fixture` to the `vllm-k2` parser's subcommands."""
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
        help="JSONL ({'prompt': ...}, optional 'temperature', 'seed') or text file, random[:N] (random token ids), "
        "load[:N] (a serving load: shared prefixes, short to long, half sampled with seeds); default: chat/code/math",
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
