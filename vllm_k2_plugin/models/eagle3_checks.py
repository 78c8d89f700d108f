"""Validate an EAGLE-3 drafter against its target before anything is served.

Reads the drafter's ``config.json`` (legacy/SpecForge, speculators, or our export)
and its safetensors *headers* (plus the small ``d2t`` tensor), and raises
DraftCheckError naming the file and the field or tensor at fault. No vLLM import:
the same checks run in vLLM's config path (eagle3-draft-preflight) and in
``vllm-k2 eagle3 check``.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from ..hf_config import text_config

#: EAGLE-3 in vLLM combines exactly three target states (0.16 hard-codes it).
NUM_AUX = 3

#: Drafters whose layer has DeepSeek MLA attention (lightseekorg/kimi-k2.5-eagle3-mla and its
#: K2.6 / K2.7 successors); vLLM builds them with its own class from 0.18 on (vLLM PR #36361).
MLA_ARCHS = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")


class DraftCheckError(ValueError):
    """A drafter that would load garbled or crash later. Names file + field/tensor."""


@dataclass
class TargetShape:
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int

    @classmethod
    def from_hf_text_config(cls, cfg) -> TargetShape:
        return cls(int(cfg.hidden_size), int(cfg.vocab_size), int(cfg.num_hidden_layers))

    @classmethod
    def from_config_file(cls, target_dir: str) -> TargetShape:
        """From a target's config.json; multimodal wrappers keep it in text_config."""
        cfg, where = read_config(target_dir, "target model")
        text = text_config(cfg)
        prefix = "text_config." if text is not cfg else ""
        try:
            return cls(int(text["hidden_size"]), int(text["vocab_size"]), int(text["num_hidden_layers"]))
        except KeyError as e:
            raise DraftCheckError(
                f"{where}: the target model's field '{prefix}{e.args[0]}' is missing "
                "(expected hidden_size, vocab_size and num_hidden_layers)"
            ) from e


@dataclass
class DraftSummary:
    layout: str
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    target_hidden_from: str  # "config" or "target"
    aux_layer_ids: tuple[int, ...] | None  # None: the target's default
    aux_ids_from: str
    architecture: str | None = None  # config.json's architectures[0] (None: a speculators config)
    weights: list[str] = field(default_factory=list)


def _field(cfg: dict, path: str, where: str, required: bool = True):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if required:
                raise DraftCheckError(f"{where}: the EAGLE-3 drafter's field '{path}' is missing")
            return None
        node = node[part]
    return node


def read_config(directory: str, role: str) -> tuple[dict, str]:
    """``directory``/config.json as a dict and its path; ``role`` ("EAGLE-3 drafter", "target
    model") names what the directory was given as, in every error."""
    path = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        raise DraftCheckError(f"{directory}: not a directory (expected the {role}'s directory, with its config.json)")
    if not os.path.isfile(path):
        raise DraftCheckError(f"{path}: not found (the {role} directory {directory} needs a config.json)")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except json.JSONDecodeError as e:
        raise DraftCheckError(f"{path}: invalid JSON in the {role}'s config ({e})") from e
    if not isinstance(cfg, dict):
        raise DraftCheckError(f"{path}: the {role}'s config must be a JSON object, got {type(cfg).__name__}")
    return cfg, path


def read_draft_config(draft_dir: str) -> tuple[dict, str]:
    return read_config(draft_dir, "EAGLE-3 drafter")


def _int_list(value, where: str, name: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) for i in value):
        raise DraftCheckError(f"{where}: field '{name}' must be a list of integers, got {value!r}")
    return tuple(value)


def summarize(draft_dir: str, target: TargetShape) -> DraftSummary:
    cfg, where = read_draft_config(draft_dir)
    speculators = "speculators_config" in cfg and "model_type" not in cfg
    layer = _field(cfg, "transformer_layer_config", where) if speculators else cfg
    prefix = "transformer_layer_config." if speculators else ""
    hidden = _field(layer, "hidden_size", where)
    vocab = _field(layer, "vocab_size", where)
    if not isinstance(hidden, int) or not isinstance(vocab, int):
        raise DraftCheckError(f"{where}: fields '{prefix}hidden_size'/'{prefix}vocab_size' must be integers")
    draft_vocab = cfg.get("draft_vocab_size") or vocab
    if vocab != target.vocab_size:
        raise DraftCheckError(
            f"{where}: field '{prefix}vocab_size' is {vocab} but the target's vocabulary has "
            f"{target.vocab_size} tokens (the drafter must map into the target's vocabulary)"
        )
    if not 0 < draft_vocab <= vocab:
        raise DraftCheckError(f"{where}: field 'draft_vocab_size' = {draft_vocab} is not in 1..{vocab}")
    th = cfg.get("target_hidden_size")
    if th is not None and th != target.hidden_size:
        raise DraftCheckError(
            f"{where}: field 'target_hidden_size' is {th} but the target's hidden size "
            f"(text_config.hidden_size) is {target.hidden_size}"
        )
    ids, src = _aux_ids(cfg, where)
    if ids is not None:
        if len(ids) != NUM_AUX:
            raise DraftCheckError(f"{where}: field '{src}' lists {len(ids)} layers; EAGLE-3 uses {NUM_AUX}")
        bad = [i for i in ids if not 0 <= i <= target.num_hidden_layers]
        if bad:
            raise DraftCheckError(
                f"{where}: field '{src}' has ids {bad} outside 0..{target.num_hidden_layers} for a "
                f"{target.num_hidden_layers}-layer target (vLLM convention: input of layer i; "
                "SpecForge ids are vLLM ids - 1)"
            )
    return DraftSummary(
        layout=draft_layout(cfg),
        hidden_size=hidden,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=th or target.hidden_size,
        target_hidden_from="config" if th else "target",
        aux_layer_ids=ids,
        aux_ids_from=src,
        architecture=architecture(cfg),
    )


def architecture(cfg: dict) -> str | None:
    archs = cfg.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def draft_layout(cfg: dict) -> str:
    """speculators / mla (DeepSeek MLA attention) / legacy (SpecForge, nested eagle_config) / flat."""
    if "speculators_config" in cfg and "model_type" not in cfg:
        return "speculators"
    if architecture(cfg) in MLA_ARCHS:
        return "mla"
    return "legacy" if "eagle_config" in cfg else "flat"


AUX_KEY = "eagle_aux_hidden_state_layer_ids"


def _aux_ids(cfg: dict, where: str) -> tuple[tuple[int, ...] | None, str]:
    """Explicit aux ids and the field they came from (top level wins over eagle_config)."""
    if AUX_KEY in cfg:
        return _int_list(cfg[AUX_KEY], where, AUX_KEY), AUX_KEY
    nested = cfg.get("eagle_config")
    if isinstance(nested, dict) and AUX_KEY in nested:
        return _int_list(nested[AUX_KEY], where, f"eagle_config.{AUX_KEY}"), f"eagle_config.{AUX_KEY}"
    return None, "target default (2, N//2, N-3)"


def _weight_files(draft_dir: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(draft_dir, "*.safetensors")))
    if not files:
        raise DraftCheckError(f"{draft_dir}: no *.safetensors file (expected the EAGLE-3 drafter's weights there)")
    return files


def check_weights(draft_dir: str, s: DraftSummary) -> None:
    """Shapes of fc / lm_head / d2t against the config and the target."""
    from safetensors import safe_open

    shapes: dict[str, tuple[list[int], str]] = {}
    for path in _weight_files(draft_dir):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                shapes[name] = (f.get_slice(name).get_shape(), path)
    s.weights = sorted(shapes)

    def find(suffix: str):
        hits = [n for n in shapes if n == suffix or n.endswith("." + suffix)]
        return hits[0] if hits else None

    fc = find("fc.weight")
    if fc is None:
        raise DraftCheckError(f"{draft_dir}: tensor 'fc.weight' is missing (EAGLE-3 combines 3 aux states)")
    (rows, cols), path = shapes[fc]
    if cols != NUM_AUX * s.target_hidden_size or rows != s.hidden_size:
        raise DraftCheckError(
            f"{path}: tensor '{fc}' has shape [{rows}, {cols}], expected "
            f"[{s.hidden_size}, {NUM_AUX} x {s.target_hidden_size}] (draft hidden, 3 x target hidden)"
        )
    head = find("lm_head.weight")
    if head is not None and shapes[head][0][0] != s.draft_vocab_size:
        raise DraftCheckError(
            f"{shapes[head][1]}: tensor '{head}' has {shapes[head][0][0]} rows but "
            f"draft_vocab_size is {s.draft_vocab_size}"
        )
    d2t = find("d2t")
    if d2t is None:
        if s.draft_vocab_size != s.vocab_size:
            raise DraftCheckError(
                f"{draft_dir}: tensor 'd2t' is missing but draft_vocab_size "
                f"({s.draft_vocab_size}) < vocab_size ({s.vocab_size}): draft ids cannot be "
                "mapped to target ids"
            )
        return
    check_d2t(shapes[d2t][1], d2t, s)


def check_d2t(path: str, name: str, s: DraftSummary, tensor=None) -> None:
    import torch

    if tensor is None:
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            tensor = f.get_tensor(name)
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or tensor.dim() != 1:
        raise DraftCheckError(
            f"{path}: tensor '{name}' must be a 1-D integer tensor of offsets, got {tensor.dtype} {list(tensor.shape)}"
        )
    if tensor.numel() != s.draft_vocab_size:
        raise DraftCheckError(
            f"{path}: tensor '{name}' has {tensor.numel()} entries, draft_vocab_size is {s.draft_vocab_size}"
        )
    target_ids = torch.arange(tensor.numel()) + tensor.long()
    if target_ids.min() < 0 or target_ids.max() >= s.vocab_size:
        raise DraftCheckError(
            f"{path}: tensor '{name}' maps draft ids outside the target vocabulary 0..{s.vocab_size - 1} "
            "(d2t holds offsets: target_id = draft_id + d2t[draft_id])"
        )
    if torch.unique(target_ids).numel() != target_ids.numel():
        raise DraftCheckError(f"{path}: tensor '{name}' maps two draft ids to the same target id")


def check_draft(draft_dir: str, target: TargetShape, weights: bool = True) -> DraftSummary:
    """The drafter's config against the target; its weight files too unless ``weights`` is
    False (``load_format="dummy"``: vLLM makes up the weights, none need to exist)."""
    summary = summarize(draft_dir, target)
    if weights:
        check_weights(draft_dir, summary)
    return summary
