"""The committed bench drafter (issue #17): its recipe is what `write_bench_recipe` writes,
the chat files it was trained on are the ones the code cuts (same corpus), and the committed
export is the one training produced (sha256 recorded by benchmarks/bench_drafter_digests.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from vllm_k2_plugin import fileio
from vllm_k2_tools.fixtures.trained_target import (
    BENCH_DRAFTER,
    corpus_digest,
    recipe_chat_files,
    stdlib_files,
    write_bench_recipe,
)
from vllm_k2_tools.train.recipe import load_recipe

from .conftest import REPO

pytestmark = pytest.mark.vllm_independent

RESULTS = REPO / "benchmarks" / "results" / "bench_ab_tiny_bench_drafter_cpu"
DIGESTS = json.loads((RESULTS / "digests.json").read_text())


def test_recipe_is_the_committed_settings(tmp_path):
    path = write_bench_recipe(str(tmp_path))
    assert fileio.sha256(path) == DIGESTS["files_sha256"]["recipe.toml"]
    r = load_recipe(path)  # every section's keys validated
    assert r["train"]["epochs"] == BENCH_DRAFTER["epochs"] == DIGESTS["settings"]["epochs"]
    assert DIGESTS["settings"] == BENCH_DRAFTER
    assert DIGESTS["stages"]["train"]["epochs"] == BENCH_DRAFTER["epochs"]
    assert DIGESTS["prepared"]["prepare.json"]["num_samples"] == BENCH_DRAFTER["train_chats"]


def test_chat_files_match_the_recorded_digests():
    if corpus_digest(stdlib_files()) != DIGESTS["corpus_sha256"]:
        pytest.skip(f"this interpreter's stdlib is not the recorded corpus (Python {DIGESTS['python']})")
    files = recipe_chat_files(BENCH_DRAFTER["train_chats"], 24)
    for name, lines in files.items():
        got = hashlib.sha256("".join(lines).encode()).hexdigest()
        assert got == DIGESTS["files_sha256"][name], name
    # the prepare stage's identity records the same train.jsonl
    assert DIGESTS["stages"]["prepare"]["data_sha256"] == [DIGESTS["files_sha256"]["train.jsonl"]]


def test_committed_drafter_is_the_export():
    for name, want in DIGESTS["export_sha256"].items():
        assert fileio.sha256(str(RESULTS / "drafter" / name)) == want, name
    cfg = json.loads((RESULTS / "drafter" / "config.json").read_text())
    draft = DIGESTS["train"]["draft"]
    layer = cfg["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["hidden_size"] == draft["hidden_size"]
    assert cfg["draft_vocab_size"] == draft["draft_vocab_size"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == draft["aux_layer_ids"]
