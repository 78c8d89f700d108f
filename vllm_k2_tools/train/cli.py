"""`vllm-k2 train <stage>`: each pipeline stage alone, `run` for all of them, `plan`."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields


def _ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError as e:
        raise SystemExit(f"--layers: expected comma-separated integers, got {text!r}") from e


def _print(obj) -> int:
    print(json.dumps(obj, indent=1))
    return 0


def _prepare(a) -> int:
    from .prepare import prepare

    return _print(
        prepare(
            a.target,
            a.data,
            a.out,
            max_len=a.max_len,
            max_samples=a.max_samples,
            regenerate_url=a.regenerate_url,
            regenerate_max_tokens=a.regenerate_max_tokens,
            concurrency=a.concurrency,
            keep_truncated=a.keep_truncated,
            retries=a.retries,
        )
    )


def _extract(a) -> int:
    from .extract import extract

    m = extract(
        a.target,
        a.prepared,
        a.out,
        layer_ids=_ids(a.layers),
        batch_size=a.batch_size,
        max_model_len=a.max_model_len,
        tensor_parallel_size=a.tensor_parallel_size,
        dtype=a.dtype,
        spool_bytes=a.spool_bytes,
        passes=a.passes,
        poll_s=a.poll_seconds,
    )
    return _print({"shards": len(m["shards"]), "complete": m.get("complete", False), "metadata": m["metadata"]})


def _vocab(a) -> int:
    from vllm_k2_plugin.hf_config import read_text_config

    from .vocab import build_vocab

    target_vocab = int(read_text_config(a.target)["vocab_size"])
    return _print(build_vocab(a.prepared, a.out, a.size, target_vocab))


def _train(a) -> int:
    from .config import TrainConfig
    from .trainer import train

    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in fields(TrainConfig)})
    return _print(train(a.target, a.extracted, a.vocab, a.out, cfg, a.draft_overrides, a.stream, a.poll_seconds))


def _export(a) -> int:
    from .export import export
    from .trainer import latest_weights

    ck, state = latest_weights(a.run)
    return _print(export(ck, state, a.target, a.out, layout=a.layout, dtype=a.dtype, k=a.k))


def _eval(a) -> int:
    from .evaluate import evaluate

    r = evaluate(a.draft, a.target, a.extracted, a.out, k_max=a.k_max)
    return _print({k: r[k] for k in ("positions", "per_position_acceptance", "tau")})


def _run(a) -> int:
    from .recipe import run

    r = run(a.recipe)
    return _print({k: v for k, v in r.items() if k != "eval"} | ({"tau": r["eval"]["tau"]} if "eval" in r else {}))


def add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="EAGLE-3 training pipeline (prepare/extract/vocab/train/export/eval/run/plan)")
    ts = t.add_subparsers(dest="train_command", required=True)

    p = ts.add_parser("prepare", help="chats -> token ids + assistant loss masks (optionally regenerated)")
    p.add_argument("--target", required=True, help="target model dir (tokenizer + chat template)")
    p.add_argument("--data", nargs="+", required=True, help=".jsonl/.json chat files or saved `datasets` dirs")
    p.add_argument("--out", required=True)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--max-samples", type=int)
    p.add_argument("--regenerate-url", help="OpenAI-compatible vLLM server of the target: regenerate answers")
    p.add_argument("--regenerate-max-tokens", type=int, default=512)
    p.add_argument("--concurrency", type=int, default=16, help="regeneration requests in flight")
    p.add_argument("--retries", type=int, default=3, help="per request, with exponential backoff")
    p.add_argument("--keep-truncated", action="store_true", help="keep regenerated answers cut at max tokens")
    p.set_defaults(func=_prepare)

    from .config import parse_bytes

    x = ts.add_parser("extract", help="aux + final hidden states through vLLM into checksummed shards")
    x.add_argument("--target", required=True, help="target model dir")
    x.add_argument("--prepared", required=True, help="output dir of `prepare`")
    x.add_argument("--out", required=True)
    x.add_argument("--layers", help="aux layer ids, vLLM convention (default 2,N//2,N-3)")
    x.add_argument("--batch-size", type=int, default=8)
    x.add_argument("--max-model-len", type=int, default=4096)
    x.add_argument("--tensor-parallel-size", type=int, default=1)
    x.add_argument("--dtype", default="auto")
    x.add_argument(
        "--spool-bytes",
        type=parse_bytes,
        help="stream: --out is a spool holding at most this many bytes of shards (e.g. '2 TB'); "
        "extraction waits while it is full and `train train --stream` drains it",
    )
    x.add_argument(
        "--passes",
        type=int,
        default=1,
        help="with --spool-bytes: extract every sample this many times "
        "(one pass per training epoch: re-extract instead of keeping shards)",
    )
    x.add_argument("--poll-seconds", type=float, default=0.5, help="how often a full spool is checked")
    x.set_defaults(func=_extract)

    v = ts.add_parser("vocab", help="draft vocabulary (d2t/t2d) from assistant-token frequencies")
    v.add_argument("--target", required=True, help="target model dir")
    v.add_argument("--prepared", required=True)
    v.add_argument("--out", required=True)
    v.add_argument("--size", type=int, default=32000)
    v.set_defaults(func=_vocab)

    from .config import TrainConfig, parse_bool

    tr = ts.add_parser("train", help="train the draft (TTT); under torchrun: DDP")
    tr.add_argument("--target", required=True)
    # `--data` is prepare's chat files; an `extract` output is `--extracted`
    tr.add_argument("--extracted", required=True, help="output dir of `extract`")
    tr.add_argument("--vocab", required=True, help="output dir of `vocab`")
    tr.add_argument("--out", required=True)
    for f in fields(TrainConfig):
        kind = {"int": int, "float": float, "str": str, "bool": parse_bool}
        typ = kind.get(str(f.type).replace("int | None", "int"), str)
        tr.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=typ, default=f.default)
    tr.add_argument(
        "--draft-overrides",
        type=json.loads,
        default=None,
        help="JSON object of DraftConfig fields (a recipe's [train] draft = {...})",
    )
    tr.add_argument(
        "--stream",
        action="store_true",
        help="--extracted is a spool `train extract --spool-bytes` fills: read shards as they arrive, "
        "delete each once no later step needs it (needs --shuffle-window >= 1)",
    )
    tr.add_argument("--poll-seconds", type=float, default=1.0, help="with --stream: how often the spool is read")
    tr.set_defaults(func=_train)

    from .config import EXPORT_LAYOUTS

    e = ts.add_parser("export", help="checkpoint -> drafter directory vLLM serves (validated)")
    e.add_argument("--run", required=True, help="output dir of `train`")
    e.add_argument("--target", required=True)
    e.add_argument("--out", required=True)
    e.add_argument(
        "--layout",
        choices=list(EXPORT_LAYOUTS),
        default=None,
        help="default: speculators for a Llama-layer drafter, mla for an MLA drafter (its only layout)",
    )
    e.add_argument("--dtype", help="default: the target's torch_dtype")
    e.add_argument("--k", type=int, default=3, help="speculative tokens recorded in the speculators config")
    e.set_defaults(func=_export)

    ev = ts.add_parser("eval", help="offline acceptance per position and tau(k), JSON + PNG")
    ev.add_argument("--draft", required=True, help="exported drafter")
    ev.add_argument("--target", required=True)
    ev.add_argument("--extracted", required=True, help="`extract` output of held-out, target-generated chats")
    ev.add_argument("--out", required=True)
    ev.add_argument("--k-max", type=int, default=5)
    ev.set_defaults(func=_eval)

    r = ts.add_parser("run", help="all stages from a recipe (TOML), resuming where it stopped")
    r.add_argument("recipe")
    r.set_defaults(func=_run)

    from .plan import register_cli

    register_cli(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="vllm-k2")
    sub = ap.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    a = ap.parse_args(argv)
    return a.func(a)
