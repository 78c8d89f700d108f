"""The training pipeline's stages on their own (no engine): chat layouts and loss masks,
draft vocabulary, checksummed shards, storage refusal, resume after a kill, export
round trip. The engine-backed end-to-end run is tests/test_train_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch

from vllm_k2_tools.train import shards
from vllm_k2_tools.train.chats import ChatFormatError, read_chats
from vllm_k2_tools.train.vocab import build_maps

from .conftest import REPO

pytestmark = pytest.mark.vllm_independent

CHAT = [{"role": "user", "content": "Continue: def f(x):"}, {"role": "assistant", "content": "    return x + 1"}]


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" if not isinstance(x, str) else x + "\n" for x in lines))
    return str(path)


def test_chat_layouts_read_alike(tmp_path):
    sharegpt = {
        "conversations": [{"from": "human", "value": CHAT[0]["content"]}, {"from": "gpt", "value": CHAT[1]["content"]}]
    }
    ultra = {"data": [CHAT[0]["content"], CHAT[1]["content"]]}
    path = _write(tmp_path / "mixed.jsonl", [{"messages": CHAT}, sharegpt, ultra])
    got = [m for _, m in read_chats(path)]
    assert got == [CHAT, CHAT, CHAT]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("{not json", "bad.jsonl:2: not valid JSON"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "bad.jsonl:2: messages[0] needs 'role'"),
        (json.dumps({"conversations": [{"from": "gpt"}]}), "bad.jsonl:2: conversations[0]"),
        (json.dumps({"text": "hello"}), "bad.jsonl:2: no 'messages', 'conversations' or 'data' field"),
        (json.dumps({"messages": [CHAT[0]]}), "bad.jsonl:2: the conversation has no assistant turn"),
    ],
)
def test_bad_chat_records_name_file_line_and_field(tmp_path, line, needle):
    path = _write(tmp_path / "bad.jsonl", [{"messages": CHAT}, line])
    with pytest.raises(ChatFormatError, match=None) as e:
        list(read_chats(path))
    assert needle in str(e.value)


def test_loss_mask_covers_exactly_the_assistant_turns(k25_model):
    from vllm_k2_tools.train.prepare import load_tokenizer, render

    tok = load_tokenizer(k25_model)
    msgs = [CHAT[0], CHAT[1], {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok then"}]
    ids, mask = render(tok, msgs, max_len=4096)
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
    masked = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert masked == "    return x + 1<|im_end|>ok then<|im_end|>"
    # Truncation keeps ids and mask aligned.
    ids2, mask2 = render(tok, msgs, max_len=7)
    assert ids2 == ids[:7] and mask2 == mask[:7]


def test_draft_vocab_maps():
    counts = Counter({5: 10, 9: 10, 2: 3, 7: 1})
    m = build_maps(counts, draft_vocab_size=3, target_vocab_size=12)
    kept = m["d2t"] + torch.arange(3)
    assert kept.tolist() == [2, 5, 9]  # top 3 by (-count, id), sorted
    assert m["t2d"].nonzero().flatten().tolist() == [2, 5, 9]
    assert m["coverage"] == pytest.approx(23 / 24)
    padded = build_maps(Counter({4: 1}), draft_vocab_size=3, target_vocab_size=12)
    assert (padded["d2t"] + torch.arange(3)).tolist() == [0, 1, 4]  # padded with the lowest unseen ids
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        build_maps(Counter({99: 1}), 3, 12)


def test_storage_estimate_and_refusal(tmp_path):
    from vllm_k2_tools.train.extract import NotEnoughSpace, check_space, storage_bytes

    assert storage_bytes(1, 7168, 3) == 57_344  # K2.5: 3 aux + final, bf16
    with pytest.raises(NotEnoughSpace, match="extract needs"):
        check_space(str(tmp_path / "x"), need=1 << 60)


def _synthetic_shards(out, text_model, n=12, seed=0, per_shard=4):
    cfg = json.load(open(os.path.join(text_model, "config.json")))
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    manifest = shards.load_manifest(out)
    manifest["metadata"] = {"layer_ids": [2, 4, 5], "hidden_size": h}
    os.makedirs(out, exist_ok=True)
    for start in range(0, n, per_shard):
        rows = []
        for i in range(start, min(n, start + per_shard)):
            t = 20 + i
            ids = torch.randint(20, vocab, (t,), generator=g)
            rows.append(
                {
                    "index": i,
                    "input_ids": ids,
                    "loss_mask": (torch.arange(t) > 5).to(torch.uint8),
                    "aux": torch.randn(t, 3 * h, generator=g).to(torch.bfloat16),
                    "final": torch.randn(t, h, generator=g).to(torch.bfloat16),
                }
            )
        shards.write_shard(out, manifest, rows)
    return out


@pytest.fixture(scope="module")
def synthetic(text_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("train-stages")
    data = _synthetic_shards(str(root / "extract"), text_model)
    return {"root": root, "data": data, "vocab": _synthetic_vocab(root / "vocab"), "target": text_model}


def _synthetic_vocab(out) -> str:
    """A draft vocabulary of 3 in 4 target tokens (d2t/t2d as `vocab` writes them)."""
    from safetensors.torch import save_file

    from vllm_k2_tools.train.vocab import VOCAB_FILE

    keep = torch.arange(1024)[torch.arange(1024) % 4 != 3]
    t2d = torch.zeros(1024, dtype=torch.bool)
    t2d[keep] = True
    os.makedirs(out)
    save_file({"d2t": keep - torch.arange(len(keep)), "t2d": t2d}, str(out / VOCAB_FILE))
    return str(out)


def test_shards_read_back_and_detect_corruption(synthetic, tmp_path):
    r = shards.ShardReader(synthetic["data"])
    assert len(r) == 12
    s = r.sample(5)
    assert s["index"] == 5 and len(s["input_ids"]) == 25 and s["aux"].shape == (25, 768)
    # Corrupt one byte of a copy: the checksum names the shard.
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(synthetic["data"], bad)
    path = bad / "shard-00001.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(shards.ShardError, match="shard-00001.safetensors: sha256 .* corrupted"):
        shards.ShardReader(str(bad)).verify_all()


def _train_cmd(s, out, steps=8):
    return [
        sys.executable,
        "-m",
        "vllm_k2_plugin.cli",
        "train",
        "train",
        "--target",
        s["target"],
        "--extracted",
        s["data"],
        "--vocab",
        s["vocab"],
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--batch-size",
        "2",
        "--ttt-steps",
        "3",
        "--save-every",
        "2",
        "--lr",
        "1e-3",
    ]


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    env.pop("VLLM_K2_DISABLE", None)
    return env


def test_train_resumes_after_kill_without_lost_or_repeated_steps(synthetic):
    from safetensors.torch import load_file

    root = synthetic["root"]
    ref, killed = root / "run-ref", root / "run-killed"
    subprocess.run(_train_cmd(synthetic, ref), check=True, env=_env(), capture_output=True)
    proc = subprocess.Popen(
        _train_cmd(synthetic, killed),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    latest = killed / "checkpoints" / "latest.json"
    deadline = time.time() + 300
    while time.time() < deadline:
        if latest.exists() and json.loads(latest.read_text())["step"] >= 4:
            break
        assert proc.poll() is None, "training ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    stopped_at = json.loads(latest.read_text())["step"]
    assert stopped_at < 8, "the run finished before the kill; nothing was resumed"
    subprocess.run(_train_cmd(synthetic, killed), check=True, env=_env(), capture_output=True)
    steps = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))  # each step logged exactly once
    a = load_file(str(ref / "checkpoints" / "step-0000008" / "draft.safetensors"))
    b = load_file(str(killed / "checkpoints" / "step-0000008" / "draft.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from an uninterrupted run"
    assert len(list((killed / "checkpoints").glob("step-*"))) == 2  # older checkpoints pruned


def test_train_refuses_a_corrupted_shard(synthetic, tmp_path):
    import shutil

    bad = tmp_path / "extract"
    shutil.copytree(synthetic["data"], bad)
    p = bad / "shard-00000.safetensors"
    p.write_bytes(p.read_bytes()[:-7])  # truncated
    s = dict(synthetic, data=str(bad))
    r = subprocess.run(_train_cmd(s, tmp_path / "run", steps=2), env=_env(), capture_output=True, text=True)
    assert r.returncode != 0 and "shard-00000.safetensors: sha256" in r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def _trained_run(synthetic, attention: str):
    """A 2-step training run of a drafter with that attention (shared by the export tests)."""
    run = synthetic["root"] / ("run-ref" if attention == "llama" else f"run-{attention}")
    if not (run / "checkpoints" / "latest.json").exists():
        cmd = _train_cmd(synthetic, run, steps=2)
        if attention != "llama":
            cmd += ["--draft-overrides", json.dumps({"attention": attention})]
        subprocess.run(cmd, check=True, env=_env(), capture_output=True)
    return run


@pytest.mark.parametrize("layout", ["speculators", "legacy", "mla"])
def test_export_round_trip(synthetic, layout, tmp_path):
    from safetensors.torch import load_file

    from vllm_k2_tools.train.export import export, load_export
    from vllm_k2_tools.train.trainer import latest_weights

    run = _trained_run(synthetic, "mla" if layout == "mla" else "llama")
    ck, state = latest_weights(str(run))
    # the MLA drafter's layout is the default for it (no layout named)
    info = export(ck, state, synthetic["target"], str(tmp_path / "draft"), layout=None if layout == "mla" else layout)
    cfg = json.load(open(tmp_path / "draft" / "config.json"))
    w = load_file(str(tmp_path / "draft" / "model.safetensors"))
    assert not any("embed" in k for k in w)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and cfg["draft_vocab_size"] == 768
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    assert any(k.startswith(prefix) for k in w) and info["layout"] == layout
    if layout == "mla":  # lightseekorg's layout: vLLM's (and the plugin's) MLA drafter class
        assert cfg["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and cfg["kv_lora_rank"] == 512
        assert "midlayer.self_attn.kv_a_proj_with_mqa.weight" in w and "midlayer.self_attn.q_proj.weight" not in w
    src = load_file(ck)
    back = load_export(str(tmp_path / "draft"), synthetic["target"]).exported_state_dict()
    assert set(back) == set(src)
    assert all(torch.equal(back[k].to(src[k].dtype), src[k]) for k in src)


def test_export_refuses_a_layout_the_drafter_cannot_take(synthetic, tmp_path):
    from vllm_k2_tools.train.export import export
    from vllm_k2_tools.train.trainer import latest_weights

    ck, state = latest_weights(str(_trained_run(synthetic, "mla")))
    with pytest.raises(ValueError, match="export layout 'speculators' cannot hold a drafter with 'mla' attention"):
        export(ck, state, synthetic["target"], str(tmp_path / "draft"), layout="speculators")
    assert not (tmp_path / "draft").exists()


def test_torchrun_two_ranks_equal_one_rank_with_accumulation(synthetic):
    """DDP (gloo, 2 processes) on the same global batch as 1 process x 2 micro-batches."""
    from safetensors.torch import load_file

    root = synthetic["root"]
    one, two = root / "dp-1", root / "dp-2"
    base = _train_cmd(synthetic, one, steps=3)
    one_cmd = [*base, "--batch-size", "2", "--grad-accum", "2"]
    subprocess.run(one_cmd, check=True, env=_env(), capture_output=True)
    two_cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *_train_cmd(synthetic, two, steps=3)[1:],
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
    ]
    r = subprocess.run(two_cmd, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((two / "train.json").read_text())["world_size"] == 2
    assert [m["loss"] for m in m2] == pytest.approx([m["loss"] for m in m1], rel=1e-5)
    assert [m["tokens"] for m in m2] == [m["tokens"] for m in m1]
    a = load_file(str(one / "checkpoints" / "step-0000003" / "draft.safetensors"))
    b = load_file(str(two / "checkpoints" / "step-0000003" / "draft.safetensors"))
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


def test_sample_reads_touch_only_their_bytes(synthetic, tmp_path):
    """An epoch in random order materialises each sample's rows once: ~1x the dataset, not
    a whole shard per sample. Storage reads (/proc/self/io, shard pages evicted first) too."""
    import random
    import shutil

    from safetensors import safe_open

    data = tmp_path / "copy"
    shutil.copytree(synthetic["data"], data)
    files = sorted(data.glob("shard-*.safetensors"))
    r = shards.ShardReader(str(data))
    r.verify_all()  # hashing reads every byte once; measure the epoch after it
    sample_bytes = 0
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in ("input_ids", "loss_mask", "aux", "final"):
                t = h.get_tensor(k)
                sample_bytes += t.numel() * t.element_size()
    for f in files:  # drop the shards from the page cache, so storage reads are counted
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

    def storage_read() -> int:
        with open("/proc/self/io") as io:
            return int(next(ln for ln in io if ln.startswith("read_bytes")).split()[1])

    before = storage_read()
    order = list(range(len(r)))
    random.Random(0).shuffle(order)
    for i in order:
        r.sample(i)
    assert r.bytes_read <= 1.1 * sample_bytes, (r.bytes_read, sample_bytes)
    file_bytes = sum(f.stat().st_size for f in files)
    assert storage_read() - before <= 1.1 * file_bytes, (storage_read() - before, file_bytes)


def test_shard_digests_are_verified_once_and_recorded(synthetic, tmp_path, monkeypatch):
    import shutil

    data = tmp_path / "copy"
    shutil.copytree(synthetic["data"], data)
    (data / shards.VERIFIED).unlink(missing_ok=True)  # as extracted: nothing verified yet
    hashed = []
    real = shards.fileio.sha256
    monkeypatch.setattr(shards.fileio, "sha256", lambda p: hashed.append(p) or real(p))
    shards.ShardReader(str(data)).verify_all()
    first = len(hashed)
    assert first == len(list(data.glob("shard-*.safetensors")))
    shards.ShardReader(str(data)).verify_all()  # a restart: the record stands
    assert len(hashed) == first
    shard = data / "shard-00001.safetensors"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # rewritten since
    shards.ShardReader(str(data)).verify_all()
    assert hashed[first:] == [str(shard)]


def test_concurrent_digest_records_lose_nothing(synthetic, tmp_path, monkeypatch):
    """Ranks that verify different shards at once all end up in verified.json: the second
    writer waits for the first's read-modify-write instead of overwriting it."""
    import shutil
    import threading

    data = tmp_path / "copy"
    shutil.copytree(synthetic["data"], data)
    (data / shards.VERIFIED).unlink(missing_ok=True)
    entries = shards.load_manifest(str(data))["shards"][:2]
    real_write, first_reading = shards.fileio.write_json, threading.Event()

    def slow_first_write(path, obj):
        if not first_reading.is_set():  # the first writer has read the record and dawdles
            first_reading.set()
            time.sleep(0.5)
        real_write(path, obj)

    monkeypatch.setattr(shards.fileio, "write_json", slow_first_write)
    first = threading.Thread(target=shards.ShardReader(str(data))._check, args=(entries[0],))
    first.start()
    first_reading.wait()
    shards.ShardReader(str(data))._check(entries[1])  # a second rank, while the first writes
    first.join()
    assert set(shards.fileio.read_json(str(data / shards.VERIFIED))) == {e["file"] for e in entries}
