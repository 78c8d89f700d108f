"""Streaming: extraction fills a spool under a byte budget while training drains it.

* fast (no engine): the sample order (bounded windows, deterministic), the recipe's
  [stream] rules, and the two halves as separate commands on real-format shards
  (``spool_replay_job.py`` replays a finished extraction through extraction's own spool
  writer), each SIGKILLed and restarted;
* vLLM 0.16 engine: `train run` with a [stream] section on the tiny trained target,
  extraction through vLLM, the extractor SIGKILLed while it waits on the full spool.

Every streaming run is checked the same way (``_check_run``): the bytes of shards on disk,
sampled from ``os.stat`` by a thread while both halves run, never exceed the budget; the
final weights equal those of an offline run over the same samples (bit for bit); each
step is logged once; the spool ends empty.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from vllm_k2_tools.procs import stop_group
from vllm_k2_tools.train import shards, spool
from vllm_k2_tools.train.order import OrderError, SampleOrder
from vllm_k2_tools.train.recipe import RecipeError, load_recipe

from .conftest import REPO, engine_env
from .test_train_stages import _synthetic_shards, _synthetic_vocab

WINDOW = 2  # shards per shuffle window
BUDGET_SHARDS = 3


def _manifest(counts, passes=None, num_samples=None):
    entries, i = [], 0
    for p, c in counts:
        entries.append({"file": f"shard-{len(entries):05d}.safetensors", "samples": list(range(i, i + c)), "pass": p})
        i += c
    meta = {"num_samples": num_samples, "passes": passes} if num_samples else {}
    return {"metadata": meta, "shards": entries}


@pytest.mark.vllm_independent
def test_whole_epoch_window_is_the_old_global_shuffle():
    m = _manifest([(0, 4), (0, 3), (0, 5)])
    order = SampleOrder(m, seed=7, window=0)
    index = [(s, j) for s, e in enumerate(m["shards"]) for j in range(len(e["samples"]))]
    for epoch in range(2):
        perm = torch.randperm(12, generator=torch.Generator().manual_seed(7 + epoch)).tolist()
        assert [order.locate(epoch * 12 + i) for i in range(12)] == [index[k] for k in perm]


@pytest.mark.vllm_independent
def test_windows_shuffle_within_their_shards_only_and_deterministically():
    m = _manifest([(0, 4)] * 6)
    order = SampleOrder(m, seed=3, window=2)
    got = [order.locate(g) for g in range(24)]
    for k in range(3):  # positions [8k, 8k+8) read exactly the samples of shards 2k, 2k+1
        assert sorted(got[8 * k : 8 * k + 8]) == [(s, j) for s in (2 * k, 2 * k + 1) for j in range(4)]
    assert got == [SampleOrder(m, seed=3, window=2).locate(g) for g in range(24)]  # a pure function
    assert got != [SampleOrder(m, seed=4, window=2).locate(g) for g in range(24)]
    assert got[:8] != sorted(got[:8])  # shuffled, not in file order
    # epoch 2 (offline keeps the shards) is another shuffle of the same windows
    again = [order.locate(24 + g) for g in range(24)]
    assert again != got and sorted(again[:8]) == sorted(got[:8])


@pytest.mark.vllm_independent
def test_streaming_order_waits_for_whole_windows_and_counts_passes():
    m = _manifest([(0, 4), (0, 4), (0, 2)], passes=2, num_samples=12)  # pass 0: 10 of 12 samples listed
    order = SampleOrder(m, seed=0, window=2, streaming=True)
    assert order.locate(7) is not None and order.locate(8) is None  # window 1 waits for its second shard
    order.update(_manifest([(0, 4), (0, 4), (0, 2), (0, 2), (1, 4)], passes=2, num_samples=12))
    assert sorted(order.locate(g)[0] for g in range(8, 12)) == [2, 2, 3, 3]
    assert order.locate(12) is None  # pass 1's first window needs shards 4 and 5
    assert order.consumed(8) == [0, 1] and sorted(order.consumed(12)) == [0, 1, 2, 3]
    order.update(_manifest([(0, 4), (0, 4), (0, 2), (0, 2), (1, 4), (1, 4), (1, 4)], passes=2, num_samples=12))
    assert order.locate(23) is not None and order.locate(23)[0] == 6  # the pass's last window: one shard
    with pytest.raises(OrderError, match="past the 2 extraction pass"):
        order.locate(24)
    with pytest.raises(OrderError, match="bounded shuffle window"):
        SampleOrder(m, seed=0, window=0, streaming=True)


@pytest.mark.vllm_independent
def test_a_shard_larger_than_the_budget_is_an_error(tmp_path):
    b = spool.Budget(str(tmp_path), 100)
    with pytest.raises(spool.SpoolError, match="one shard needs 101 B, more than the spool budget of 100 B"):
        b.make_room(101)


@pytest.mark.vllm_independent
def test_training_restart_deletes_shards_recorded_released_but_left_on_disk(text_model, tmp_path):
    """A training killed between recording a release and deleting the files: the restart
    deletes them (they count against the budget and are never free again: a deadlock)."""
    from vllm_k2_plugin import fileio
    from vllm_k2_tools.train.shards import ShardReader
    from vllm_k2_tools.train.stream import StreamFeed

    d = _synthetic_shards(str(tmp_path / "spool"), text_model, n=12, per_shard=4)
    files = [e["file"] for e in shards.load_manifest(d)["shards"]]
    fileio.write_json(os.path.join(d, spool.RELEASED), {"files": files[:2]})  # recorded, not yet deleted
    before = spool.usage_bytes(d)
    StreamFeed(ShardReader(d), None, 0.05, rank=0, world=1)
    assert not any(os.path.exists(os.path.join(d, f)) for f in files[:2])
    assert os.path.exists(os.path.join(d, files[2])) and spool.usage_bytes(d) < before


STREAM_BASE = 'work_dir = "w"\n[target]\nmodel = "m"\n[prepare]\ndata = ["a.jsonl"]\n'


@pytest.mark.vllm_independent
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("[stream]\nspool_bytes = '3 GB'\nspool_byte = 1\n", "unknown key(s) ['spool_byte'] in [stream]"),
        ("[stream]\npoll_seconds = 1\n[train]\nshuffle_window = 2\n", "[stream] needs spool_bytes"),
        ("[stream]\nspool_bytes = 'lots'\n[train]\nshuffle_window = 2\n", "[stream] spool_bytes"),
        ("[stream]\nspool_bytes = 1e9\n", "[train] shuffle_window must be >= 1"),
        ("[stream]\nspool_bytes = 1e9\n[train]\nshuffle_window = 2\nepochs = 1.5\n", "[train] epochs"),
    ],
)
def test_stream_recipe_errors_name_section_and_key(tmp_path, extra, needle):
    (tmp_path / "r.toml").write_text(STREAM_BASE + extra)
    with pytest.raises(RecipeError) as e:
        load_recipe(str(tmp_path / "r.toml"))
    assert needle in str(e.value) and "r.toml" in str(e.value)


@pytest.mark.vllm_independent
def test_stream_recipe_loads(tmp_path):
    (tmp_path / "r.toml").write_text(STREAM_BASE + "[stream]\nspool_bytes = '1.5 GB'\n[train]\nshuffle_window = 4\n")
    assert load_recipe(str(tmp_path / "r.toml"))["stream"]["spool_bytes"] == 1_500_000_000


# ----------------------------------------------------------------------------- whole runs


class DiskSampler:
    """The bytes of shard files (and their temporaries) in a directory, from os.stat, as
    often as the thread gets to run; `high` is the most it saw."""

    def __init__(self, path: Path):
        self.path, self.high, self.samples = path, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = 0
            for name in os.listdir(self.path) if self.path.exists() else []:
                if name.endswith(".safetensors"):
                    try:
                        total += os.stat(self.path / name).st_size
                    except FileNotFoundError:
                        pass
            self.high, self.samples = max(self.high, total), self.samples + 1
            time.sleep(0.002)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("VLLM_K2_DISABLE", None)
    return env


def _wait_for(cond, what, procs=(), timeout=600):
    deadline = time.time() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, f"{what}: a process ended first (exit {p.returncode})"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _kill(p):
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _stop_leftovers():
    """A failed test leaves no process behind (torchrun's workers included)."""
    yield
    while _STARTED:
        stop_group(_STARTED.pop(), grace_s=5)


def _popen(cmd, log: Path, env=None):
    with open(log, "a") as f:  # the child keeps its own descriptor
        p = subprocess.Popen(cmd, env=env or _env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    _STARTED.append(p)
    return p


def _tail(log: Path) -> str:
    return log.read_text()[-3000:] if log.exists() else ""


def _child(parent: int, needle: str) -> int:
    """The child process of `parent` whose command line contains `needle` (NUL-separated)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for c in children:
        if needle in Path(f"/proc/{c}/cmdline").read_text():
            return int(c)
    raise AssertionError(f"no child of {parent} runs {needle!r}")


def _weights(run: Path, step: int) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoints" / f"step-{step:07d}" / "draft.safetensors"))


def _check_run(run: Path, spool_dir: Path, sampler: DiskSampler, budget: int, reference: dict, steps: int):
    print(f"spool high-water {sampler.high:,} B of a {budget:,} B budget ({sampler.samples:,} samples of the disk)")
    assert sampler.samples > 100, "the disk sampler hardly ran"
    assert 0 < sampler.high <= budget, (sampler.high, budget)
    logged = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, steps + 1))  # every step once: nothing lost, nothing used twice
    got = _weights(run, steps)
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference), "streaming weights differ from offline"
    listed = [e["file"] for e in shards.load_manifest(str(spool_dir))["shards"]]
    assert sorted(spool.released(str(spool_dir))) == sorted(listed)
    assert not list(spool_dir.glob("*.safetensors")), "shards left in the spool"


TRAIN = [
    "--batch-size",
    "2",
    "--ttt-steps",
    "3",
    "--save-every",
    "100",
    "--lr",
    "1e-3",
    "--shuffle-window",
    str(WINDOW),
]


@pytest.fixture(scope="module")
def source(text_model, tmp_path_factory):
    """A finished extraction in the shard format (24 samples, 2 per shard) and a vocab."""
    root = tmp_path_factory.mktemp("stream-src")
    data = _synthetic_shards(str(root / "extract"), text_model, n=24, per_shard=2)
    return {"root": root, "data": data, "vocab": _synthetic_vocab(root / "vocab"), "target": text_model}


def _train_cmd(src, data, out, *extra):
    return [
        sys.executable,
        "-m",
        "vllm_k2_plugin.cli",
        "train",
        "train",
        "--target",
        src["target"],
        "--extracted",
        str(data),
        "--vocab",
        src["vocab"],
        "--out",
        str(out),
        *TRAIN,
        *extra,
    ]


@pytest.mark.vllm_independent
def test_separate_commands_killed_and_restarted_match_offline_within_budget(source, tmp_path):
    steps = 12  # 24 samples / global batch 2
    subprocess.run(
        _train_cmd(source, source["data"], tmp_path / "offline"), check=True, env=_env(), capture_output=True
    )
    reference = _weights(tmp_path / "offline", steps)
    spool_dir, run = tmp_path / "spool", tmp_path / "run"
    sizes = [e["bytes"] for e in shards.load_manifest(source["data"])["shards"]]
    budget = BUDGET_SHARDS * max(sizes)
    produce = [sys.executable, str(REPO / "tests" / "spool_replay_job.py"), source["data"], str(spool_dir), str(budget)]
    consume = _train_cmd(source, spool_dir, run, "--stream", "--poll-seconds", "0.05")
    with DiskSampler(spool_dir) as sampler:
        # 1. the extractor fills the spool, waits for room, and is SIGKILLed while it waits
        p = _popen(produce, tmp_path / "extract.log")
        _wait_for(lambda: (spool_dir / spool.WAITING).exists(), "extraction to wait on a full spool", [p])
        _kill(p)
        assert len(shards.load_manifest(str(spool_dir))["shards"]) >= BUDGET_SHARDS  # (smaller shards: more fit)
        # 2. training drains what is there (a checkpoint, then deletions) and waits for more:
        #    SIGKILLed mid-run
        t = _popen(consume, tmp_path / "train.log")
        latest = run / "checkpoints" / "latest.json"
        _wait_for(lambda: spool.released(str(spool_dir)), "training to delete shards", [t])
        _kill(t)
        assert latest.exists(), "shards were deleted before a checkpoint covered them"
        stopped = json.loads(latest.read_text())["step"]
        assert 0 < stopped < steps
        # 3. both restart and finish
        p, t = _popen(produce, tmp_path / "extract.log"), _popen(consume, tmp_path / "train.log")
        assert t.wait(timeout=600) == 0, _tail(tmp_path / "train.log")
        assert p.wait(timeout=60) == 0, _tail(tmp_path / "extract.log")
    _check_run(run, spool_dir, sampler, budget, reference, steps)


# ----------------------------------------------------------------------------- vLLM 0.16


@pytest.mark.slow
@pytest.mark.vllm016
def test_train_run_streams_through_vllm_survives_kills_and_matches_offline(tmp_path):
    """`train run` with [stream]: extraction through a vLLM 0.16 engine into a spool of 3
    shards while training drains it; the extractor is SIGKILLed while it waits on the full
    spool, then the trainer mid-run; `train run` reports the dead halves, and its rerun
    finishes with the weights of an offline `train run` over the same samples."""
    from vllm_k2_tools.fixtures.trained_target import write_tiny_recipe

    write_tiny_recipe(str(tmp_path), train_chats=32, eval_chats=1)
    body = """[target]
model = "target"
[prepare]
data = ["train.jsonl"]
max_len = 448
regenerate = false
[extract]
batch_size = 4
max_model_len = 512
dtype = "float32"
[vocab]
size = 768
[train]
epochs = 1
batch_size = 2
lr = 1e-3
ttt_steps = 3
save_every = 100
shuffle_window = 2
"""
    env = engine_env(VLLM_MLA_DISABLE="1", OMP_NUM_THREADS="1")
    (tmp_path / "offline.toml").write_text('work_dir = "offline"\n' + body)
    r = subprocess.run(
        [sys.executable, "-m", "vllm_k2_plugin.cli", "train", "run", str(tmp_path / "offline.toml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    steps = 16  # 32 samples / global batch 2
    reference = _weights(tmp_path / "offline" / "train", steps)
    sizes = [e["bytes"] for e in shards.load_manifest(str(tmp_path / "offline" / "extract"))["shards"]]
    budget = BUDGET_SHARDS * max(sizes)
    (tmp_path / "stream.toml").write_text(
        'work_dir = "stream"\n' + body + f"[stream]\nspool_bytes = {budget}\npoll_seconds = 0.1\n"
    )
    cmd = [sys.executable, "-m", "vllm_k2_plugin.cli", "train", "run", str(tmp_path / "stream.toml")]
    run, spool_dir = tmp_path / "stream" / "train", tmp_path / "stream" / "train" / "spool"
    marker = spool_dir / spool.WAITING
    with DiskSampler(spool_dir) as sampler:
        first = _popen(cmd, tmp_path / "first.log", env=env)
        # the extractor waits on a full spool after the trainer freed shards once: kill it there
        _wait_for(lambda: spool.released(str(spool_dir)) and marker.exists(), "extraction waiting", [first])
        trainer = _child(first.pid, "train\0train\0")
        try:
            os.kill(json.loads(marker.read_text())["pid"], signal.SIGKILL)
        except (FileNotFoundError, ValueError):  # it got room and removed the marker just now
            pytest.fail("the extractor stopped waiting before it could be killed; rerun")
        os.kill(trainer, signal.SIGKILL)
        assert first.wait(timeout=300) != 0  # `train run` reports the dead halves
        stopped = json.loads((run / "checkpoints" / "latest.json").read_text())["step"]
        assert 0 < stopped < steps
        assert len(shards.load_manifest(str(spool_dir))["shards"]) < 8  # extraction was mid-run too
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    log_text = (tmp_path / "first.log").read_text()
    assert "exited with -9" in log_text, log_text[-3000:]
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    assert "[train] resuming" in second.stdout
    _check_run(run, spool_dir, sampler, budget, reference, steps)


@pytest.mark.vllm_independent
def test_torchrun_streaming_matches_torchrun_offline(source, tmp_path):
    """Two DDP ranks (gloo) drain the spool as one: rank 0 decides when to wait, checkpoint
    and delete, and both read the same order as a two-rank offline run."""

    def torchrun(data, out, *extra):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            *_train_cmd(source, data, out, *extra)[1:],
            "--batch-size",
            "1",
        ]
        return cmd

    r = subprocess.run(torchrun(source["data"], tmp_path / "offline"), env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    spool_dir = tmp_path / "spool"
    budget = BUDGET_SHARDS * max(e["bytes"] for e in shards.load_manifest(source["data"])["shards"])
    produce = [sys.executable, str(REPO / "tests" / "spool_replay_job.py"), source["data"], str(spool_dir), str(budget)]
    with DiskSampler(spool_dir) as sampler:
        p = _popen(produce, tmp_path / "extract.log")
        t = _popen(torchrun(spool_dir, tmp_path / "run", "--stream", "--poll-seconds", "0.05"), tmp_path / "train.log")
        assert t.wait(timeout=600) == 0, _tail(tmp_path / "train.log")
        assert p.wait(timeout=60) == 0, _tail(tmp_path / "extract.log")
    assert "extract: spool full" in (tmp_path / "extract.log").read_text()  # the budget was binding
    _check_run(tmp_path / "run", spool_dir, sampler, budget, _weights(tmp_path / "offline", 12), 12)


@pytest.mark.vllm_independent
def test_a_budget_too_small_for_a_window_is_an_error_not_a_hang(source, tmp_path):
    """One shard of budget, two shards per window: extraction waits for room that only
    training could free, training waits for the window's second shard. Training says so."""
    spool_dir = tmp_path / "spool"
    budget = max(e["bytes"] for e in shards.load_manifest(source["data"])["shards"])
    produce = [sys.executable, str(REPO / "tests" / "spool_replay_job.py"), source["data"], str(spool_dir), str(budget)]
    p = _popen(produce, tmp_path / "extract.log")
    t = _popen(
        _train_cmd(source, spool_dir, tmp_path / "run", "--stream", "--poll-seconds", "0.05"), tmp_path / "train.log"
    )
    assert t.wait(timeout=300) != 0
    assert "the spool budget cannot hold the shards one step reads" in _tail(tmp_path / "train.log")
    assert p.poll() is None  # extraction still waits (an operator may raise the budget and restart)
