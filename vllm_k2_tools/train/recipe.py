"""``vllm-k2 train run recipe.toml``: all stages in order, resuming where a previous run
stopped. A stage is done when its directory holds ``stage.json`` with the same settings
and the same inputs (the digests of the stages it reads, written last, atomically); a
stage whose settings or inputs changed is redone, and so, through the digests, is every
stage after it. Extraction and training also resume inside a stage (shards, checkpoints).

    work_dir = "runs/k25"                 # relative to the recipe file
    [target]   model = "/models/Kimi-K2.5"
    [prepare]  data = ["train.jsonl"], max_len = 2048, regenerate = "serve" (default) | "http://..." | false,
               regenerate_max_tokens = 512, serve_args = ["--tensor-parallel-size", "8"], concurrency = 16
    [eval_data] data = ["heldout.jsonl"]  # optional: prepared/extracted the same way, used by eval
    [extract]  layers = [2, 30, 58], batch_size = 8, max_model_len = 4096, tensor_parallel_size = 8
    [vocab]    size = 32000
    [train]    epochs = 1, lr = 1e-4, ttt_steps = 7, ..., nproc = 8   (TrainConfig fields + nproc)
               draft = {attention = "mla"}   # optional DraftConfig overrides; "mla": DeepSeek MLA attention
    [stream]   spool_bytes = "2 TB", poll_seconds = 1.0   # optional: extraction and training run together,
               # through a spool of at most spool_bytes of shards (work_dir/train/spool); needs
               # [train] shuffle_window >= 1 and a whole number of epochs (each epoch re-extracts)
    [export]   layout = "speculators", k = 3     # layout: speculators / legacy, or mla (MLA drafters' only one)
    [eval]     k_max = 5
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import fields

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (setup.py installs tomli there)
    import tomli as tomllib

from vllm_k2_plugin import fileio
from vllm_k2_tools.procs import start_group, stop_group

STAGES = ("prepare", "prepare_eval", "extract", "extract_eval", "vocab", "train", "export", "eval")


class RecipeError(ValueError):
    pass


def load_recipe(path: str) -> dict:
    with open(path, "rb") as f:
        try:
            r = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise RecipeError(f"{path}: {e}") from e
    base = os.path.dirname(os.path.abspath(path))
    for key in ("work_dir",):
        if key not in r:
            raise RecipeError(f"{path}: missing top-level '{key}'")
    if "model" not in r.get("target", {}):
        raise RecipeError(f"{path}: missing [target] model")
    if not r.get("prepare", {}).get("data"):
        raise RecipeError(f"{path}: missing [prepare] data (a list of chat files)")

    def rel(p: str) -> str:
        return p if os.path.isabs(p) or "://" in p else os.path.normpath(os.path.join(base, p))

    r["work_dir"] = rel(r["work_dir"])
    r["target"]["model"] = rel(r["target"]["model"])
    for sec in ("prepare", "eval_data"):
        if sec in r:
            r[sec]["data"] = [rel(p) for p in r[sec]["data"]]
    check_keys(r, path)
    check_layout(r, path)
    if "stream" in r:
        check_stream(r, path)
    return r


def check_layout(r: dict, path: str) -> None:
    """The draft's attention and the export layout agree, before anything runs (not after training)."""
    from .config import EXPORT_LAYOUTS_BY_ATTENTION

    draft = r.get("train", {}).get("draft") or {}
    attention = draft.get("attention", "llama")
    if attention not in EXPORT_LAYOUTS_BY_ATTENTION:
        raise RecipeError(
            f"{path}: [train] draft.attention must be one of {sorted(EXPORT_LAYOUTS_BY_ATTENTION)}, not {attention!r}"
        )
    layout = r.get("export", {}).get("layout")
    if layout is not None and layout not in EXPORT_LAYOUTS_BY_ATTENTION[attention]:
        raise RecipeError(
            f"{path}: [export] layout {layout!r} cannot hold a drafter with {attention!r} attention; "
            f"use one of {EXPORT_LAYOUTS_BY_ATTENTION[attention]} or leave it out"
        )


def check_stream(r: dict, path: str) -> None:
    """Streaming's settings, checked before anything runs (an error names section and key)."""
    import argparse

    from .config import parse_bytes

    st, tr = r["stream"], r.get("train", {})
    if "spool_bytes" not in st:
        raise RecipeError(f"{path}: [stream] needs spool_bytes (the spool's byte budget, e.g. '2 TB')")
    try:
        st["spool_bytes"] = parse_bytes(st["spool_bytes"])
    except argparse.ArgumentTypeError as e:
        raise RecipeError(f"{path}: [stream] spool_bytes: {e}") from None
    if int(tr.get("shuffle_window", 0)) < 1:
        raise RecipeError(f"{path}: [train] shuffle_window must be >= 1 shards with [stream] (a bounded window)")
    epochs = tr.get("epochs", 1)
    if epochs != int(epochs) or epochs < 1:
        raise RecipeError(f"{path}: [train] epochs must be a whole number with [stream] (each epoch re-extracts)")


def known_keys() -> dict[str, set[str]]:
    """Every key each section may hold (what run() reads); "" is the top level."""
    from .config import TrainConfig

    return {
        "": {"work_dir", "target", "prepare", "eval_data", "extract", "vocab", "train", "export", "eval", "stream"},
        "target": {"model"},
        "prepare": {
            "data",
            "max_len",
            "max_samples",
            "regenerate",
            "regenerate_max_tokens",
            "serve_args",
            "concurrency",
            "retries",
            "keep_truncated",
        },
        "eval_data": {"data", "max_samples"},
        "extract": {"layers", "batch_size", "max_model_len", "tensor_parallel_size", "dtype"},
        "vocab": {"size"},
        "train": {f.name for f in fields(TrainConfig)} | {"nproc", "draft"},
        "export": {"layout", "dtype", "k"},
        "eval": {"k_max"},
        "stream": {"spool_bytes", "poll_seconds"},
    }


def check_keys(r: dict, path: str) -> None:
    """An unknown key is an error naming its section (a typo must not be silently ignored)."""
    known = known_keys()
    for section, keys in known.items():
        table = r if section == "" else r.get(section, {})
        if not isinstance(table, dict):
            raise RecipeError(f"{path}: [{section}] must be a table")
        bad = sorted(set(table) - keys)
        if bad:
            where = "top level" if section == "" else f"[{section}]"
            raise RecipeError(f"{path}: unknown key(s) {bad} in {where}; known: {sorted(keys)}")


def _done(stage_dir: str, settings: dict) -> bool:
    p = os.path.join(stage_dir, "stage.json")
    return os.path.exists(p) and fileio.read_json(p) == settings


def _mark(stage_dir: str, settings: dict) -> None:
    fileio.write_json(os.path.join(stage_dir, "stage.json"), settings)


def run(recipe_path: str, log=print) -> dict:
    r = load_recipe(recipe_path)
    wd, model = r["work_dir"], r["target"]["model"]
    os.makedirs(wd, exist_ok=True)
    d = {s: os.path.join(wd, s) for s in STAGES}
    prep, ext = r["prepare"], r.get("extract", {})

    chain = {"": ""}  # settings digest of the stage before, per dependency line

    def stage(name: str, settings: dict, fn, after: tuple[str, ...] = ("",)) -> None:
        # A stage's identity includes its inputs' identity: a changed upstream stage makes
        # every stage after it stale, across invocations too.
        settings = {"model": model, **settings, "after": [chain[a] for a in after]}
        chain[name] = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        if _done(d[name], settings):
            log(f"[{name}] done already ({d[name]})")
            return
        pending = os.path.join(d[name], "stage.pending.json")
        # Resume a stage interrupted with the same settings and inputs (shards, checkpoints);
        # anything else in its directory is stale.
        if os.path.exists(pending) and fileio.read_json(pending) == settings:
            log(f"[{name}] resuming -> {d[name]}")
        else:
            shutil.rmtree(d[name], ignore_errors=True)
            log(f"[{name}] running -> {d[name]}")
        os.makedirs(d[name], exist_ok=True)
        fileio.write_json(pending, settings)
        t0 = time.monotonic()
        fn()
        _mark(d[name], settings)
        log(f"[{name}] finished in {time.monotonic() - t0:.0f} s")
        with contextlib.suppress(FileNotFoundError):  # atomic stages replace their whole directory
            os.unlink(pending)

    from .prepare import prepare

    # The data files' content is part of the settings: edited data redoes the stages.
    p_set = {**{k: v for k, v in prep.items() if k != "serve_args"}, "data_sha256": _digests(prep["data"])}
    e_set = None
    if "eval_data" in r:
        ev = r["eval_data"]
        e_set = {**p_set, **ev, "data_sha256": _digests(ev["data"])}
    prepared = _done(d["prepare"], {"model": model, **p_set, "after": [""]}) and (
        e_set is None or _done(d["prepare_eval"], {"model": model, **e_set, "after": [""]})
    )
    # No regeneration server when both prepare stages are done already.
    with _regeneration_server(None if prepared else prep, model, log) as url:
        common = dict(
            max_len=prep.get("max_len", 2048),
            regenerate_url=url,
            regenerate_max_tokens=prep.get("regenerate_max_tokens", 512),
            concurrency=prep.get("concurrency", 16),
            retries=prep.get("retries", 3),
            keep_truncated=prep.get("keep_truncated", False),
        )
        stage(
            "prepare",
            p_set,
            lambda: prepare(model, prep["data"], d["prepare"], max_samples=prep.get("max_samples"), **common),
        )
        if e_set is not None:
            stage(
                "prepare_eval",
                e_set,
                lambda: prepare(model, ev["data"], d["prepare_eval"], max_samples=ev.get("max_samples"), **common),
            )
    from .extract import extract

    x = dict(
        layer_ids=ext.get("layers"),
        batch_size=ext.get("batch_size", 8),
        max_model_len=ext.get("max_model_len", 4096),
        tensor_parallel_size=ext.get("tensor_parallel_size", 1),
        dtype=ext.get("dtype", "auto"),
    )
    if "stream" not in r:
        stage("extract", ext, lambda: extract(model, d["prepare"], d["extract"], log=log, **x), after=("prepare",))
    if "eval_data" in r:
        stage(
            "extract_eval",
            ext,
            lambda: extract(model, d["prepare_eval"], d["extract_eval"], log=log, **x),
            after=("prepare_eval",),
        )
    from vllm_k2_plugin.hf_config import read_text_config

    from .vocab import build_vocab

    voc = r.get("vocab", {})
    target_vocab = int(read_text_config(model)["vocab_size"])
    stage(
        "vocab",
        voc,
        lambda: build_vocab(d["prepare"], d["vocab"], voc.get("size", 32000), target_vocab),
        after=("prepare",),
    )
    tr = dict(r.get("train", {}))
    if "stream" in r:  # extraction and training together, through a bounded spool
        st = r["stream"]
        settings = {"train": tr, "extract": ext, "stream": st}
        stage("train", settings, lambda: _stream(model, d, x, tr, st, log), after=("prepare", "vocab"))
    else:
        stage("train", tr, lambda: _train(model, d, tr, log), after=("extract", "vocab"))
    ex = r.get("export", {})
    from .export import export
    from .trainer import latest_weights

    def _export():
        ck, state = latest_weights(d["train"])
        export(
            ck,
            state,
            model,
            d["export"],
            layout=ex.get("layout"),  # absent: the default for the draft's attention
            dtype=ex.get("dtype"),
            k=ex.get("k", 3),
        )

    stage("export", ex, _export, after=("train",))
    result: dict = {"work_dir": wd, "export": d["export"]}
    if "eval_data" in r:
        from .evaluate import evaluate

        evc = r.get("eval", {})
        stage(
            "eval",
            evc,
            lambda: evaluate(d["export"], model, d["extract_eval"], d["eval"], k_max=evc.get("k_max", 5)),
            after=("export", "extract_eval"),
        )
        result["eval"] = fileio.read_json(os.path.join(d["eval"], "eval.json"))
    return result


def _digests(paths: list[str]) -> list[str]:
    return [fileio.sha256(p) if os.path.isfile(p) else f"dir:{p}" for p in paths]


def _train(model: str, d: dict, tr: dict, log) -> None:
    from .config import TrainConfig
    from .trainer import train

    tr = dict(tr)
    nproc = int(tr.pop("nproc", 1))
    draft = tr.pop("draft", None)
    if nproc <= 1:
        train(model, d["extract"], d["vocab"], d["train"], TrainConfig(**tr), draft)
        return
    cmd = torchrun_command(model, d, tr, draft, nproc)
    log(" ".join(cmd))
    subprocess.run(cmd, check=True)


def torchrun_command(model: str, d: dict, tr: dict, draft: dict | None, nproc: int, extra=()) -> list[str]:
    """Several processes: torchrun runs the same stage CLI in each (DDP), with exactly the
    settings a single-process run gets (TrainConfig fields and the draft overrides); one
    process (nproc 1): that CLI alone."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    cmd = [
        sys.executable,
        *launcher,
        "-m",
        "vllm_k2_plugin.cli",
        "train",
        "train",
        "--target",
        model,
        "--extracted",
        d["extract"],
        "--vocab",
        d["vocab"],
        "--out",
        d["train"],
        *extra,
    ]
    for k, v in tr.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    if draft:
        cmd += ["--draft-overrides", json.dumps(draft, sort_keys=True)]
    return cmd


def _stream(model: str, d: dict, x: dict, tr: dict, st: dict, log) -> None:
    """Streaming on one host: the two halves are the same commands a two-host run starts by
    hand (`train extract --spool-bytes` and `train train --stream` on one directory), here as
    child processes. When one fails the other is stopped (safe at any point: both resume from
    disk) and the stage fails; rerunning `train run` resumes both."""
    tr = dict(tr)
    nproc, draft = int(tr.pop("nproc", 1)), tr.pop("draft", None)
    spool_dir = os.path.join(d["train"], "spool")
    poll = float(st.get("poll_seconds", 1.0))
    produce = [
        sys.executable,
        "-m",
        "vllm_k2_plugin.cli",
        "train",
        "extract",
        "--target",
        model,
        "--prepared",
        d["prepare"],
        "--out",
        spool_dir,
        "--spool-bytes",
        str(st["spool_bytes"]),
        "--passes",
        str(int(tr.get("epochs", 1))),
        "--poll-seconds",
        str(poll),
        "--batch-size",
        str(x["batch_size"]),
        "--max-model-len",
        str(x["max_model_len"]),
        "--tensor-parallel-size",
        str(x["tensor_parallel_size"]),
        "--dtype",
        x["dtype"],
    ]
    if x["layer_ids"]:
        produce += ["--layers", ",".join(str(i) for i in x["layer_ids"])]
    consume = torchrun_command(
        model, {**d, "extract": spool_dir}, tr, draft, nproc, extra=["--stream", "--poll-seconds", str(poll)]
    )
    os.makedirs(spool_dir, exist_ok=True)
    procs = {}
    try:
        for name, cmd in (("extract", produce), ("train", consume)):
            log(f"[train] streaming: {name}: {' '.join(cmd)}")
            # own process group: stopping it stops torchrun's workers too
            procs[name] = start_group(cmd)
        while True:
            codes = {n: p.poll() for n, p in procs.items()}
            failed = {n: rc for n, rc in codes.items() if rc not in (None, 0)}
            if failed:
                raise RuntimeError(
                    f"[train] streaming: {', '.join(f'{n} exited with {rc}' for n, rc in failed.items())}; "
                    "the other half is stopped. Rerun `train run` to resume both."
                )
            if all(rc == 0 for rc in codes.values()):
                return
            time.sleep(poll)
    finally:
        for p in procs.values():
            stop_group(p)  # SIGTERM first: torchrun stops its workers; neither half needs a clean exit


@contextlib.contextmanager
def _regeneration_server(prep: dict | None, model: str, log):
    # default "serve": the target writes the answers it is trained to draft (speculators' default;
    # raw dataset answers inflate measured acceptance). A prepared, regenerated dataset: false.
    # None: nothing left to regenerate (the prepare stages are done), so no server.
    how = False if prep is None else prep.get("regenerate", "serve")
    if not how:
        yield None
    elif how == "serve":
        from vllm_k2_tools.bench.server import vllm_server

        log(f"[prepare] starting a vLLM server for {model} to regenerate assistant turns")
        with vllm_server(model, list(prep.get("serve_args", []))) as url:
            yield url
    elif isinstance(how, str) and how.startswith("http"):
        yield how
    else:
        raise RecipeError(f"[prepare] regenerate must be false, 'serve' or a server URL, not {how!r}")
