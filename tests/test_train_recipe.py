"""Recipe and CLI rules of the training pipeline: every section validated, the same
settings reach a torchrun run as a single-process one, resume loads strictly."""

from __future__ import annotations

import json

import pytest
import torch

from vllm_k2_plugin.cli import build_parser
from vllm_k2_tools.train.draft_model import DraftConfig, Eagle3Draft
from vllm_k2_tools.train.recipe import RecipeError, load_recipe, torchrun_command

pytestmark = pytest.mark.vllm_independent

BASE = 'work_dir = "w"\n[target]\nmodel = "m"\n[prepare]\ndata = ["a.jsonl"]\n'


@pytest.mark.parametrize(
    ("extra", "where", "key"),
    [
        ("[extract]\nbach_size = 8\n", "[extract]", "bach_size"),
        ("[vocab]\nsize = 10\nsizes = 3\n", "[vocab]", "sizes"),
        ("[export]\nlayuot = 'legacy'\n", "[export]", "layuot"),
        ("[eval]\nkmax = 5\n", "[eval]", "kmax"),
        ("[train]\nlearning_rate = 1e-4\n", "[train]", "learning_rate"),
        ("", "[prepare]", "max_lenn"),
        ("wokr_dir = 'x'\n", "top level", "wokr_dir"),
    ],
)
def test_unknown_keys_name_section_and_key(tmp_path, extra, where, key):
    text = BASE + ("max_lenn = 3\n" if key == "max_lenn" else "")
    if key == "wokr_dir":
        text = extra + text
    else:
        text += extra
    (tmp_path / "r.toml").write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(str(tmp_path / "r.toml"))
    assert where in str(e.value) and key in str(e.value) and "r.toml" in str(e.value)


def test_known_keys_load(tmp_path):
    (tmp_path / "r.toml").write_text(
        BASE + "concurrency = 4\n[extract]\nbatch_size = 2\n[train]\nnproc = 2\n"
        "[train.draft]\nnum_attention_heads = 4\n"
    )
    r = load_recipe(str(tmp_path / "r.toml"))
    assert r["prepare"]["concurrency"] == 4 and r["train"]["draft"] == {"num_attention_heads": 4}


def test_torchrun_gets_the_same_settings_as_one_process():
    d = {"extract": "x", "vocab": "v", "train": "t"}
    tr = {"lr": 0.002, "bf16": False, "ttt_steps": 5}
    cmd = torchrun_command("target", d, tr, {"num_attention_heads": 4, "intermediate_size": 96}, nproc=2)
    a = build_parser().parse_args(cmd[cmd.index("vllm_k2_plugin.cli") + 1 :])
    assert (a.lr, a.bf16, a.ttt_steps) == (0.002, False, 5)
    assert a.draft_overrides == {"num_attention_heads": 4, "intermediate_size": 96}
    assert json.loads(cmd[cmd.index("--draft-overrides") + 1]) == a.draft_overrides


def _tiny_draft():
    dims = dict(hidden_size=32, target_hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    cfg = DraftConfig(**dims, intermediate_size=64, draft_vocab_size=8, vocab_size=16, aux_layer_ids=[1, 2, 3])
    torch.manual_seed(0)
    return Eagle3Draft(cfg, torch.randn(16, 32), torch.zeros(8, dtype=torch.long), torch.ones(16, dtype=torch.bool))


def test_resume_loads_strictly():
    src, dst = _tiny_draft(), _tiny_draft()
    state = src.exported_state_dict()
    dst.load_exported(dict(state), "ck/draft.safetensors")
    assert all(torch.equal(v, dst.exported_state_dict()[k]) for k, v in state.items())
    with pytest.raises(ValueError, match="unexpected"):
        dst.load_exported({**state, "extra.weight": torch.zeros(1)}, "ck/draft.safetensors")
    missing = dict(state)
    missing.pop(next(k for k in state if k.startswith("midlayer.")))
    with pytest.raises(ValueError, match="ck/draft.safetensors"):
        dst.load_exported(missing, "ck/draft.safetensors")
