"""Stage 6, ``eval``: offline acceptance of an exported drafter against the target's
greedy continuations, per draft position and as mean acceptance length tau(k).

For every position t inside an assistant span the chain vLLM would draft there is
replayed: step j reads the sample's token at t+1+j (the evaluation data are the target's
own greedy answers, so this is the token verification accepted) and the draft's own
hidden state, and is accepted when its argmax (draft vocab mapped to target ids) equals
the target's greedy next token, given steps < j were.
The target's greedy tokens come from its own final hidden states and LM head (the
extraction of the evaluation prompts), so "accepted" means exactly what greedy
verification in vLLM means. tau(k) = 1 + E[min(accepted run, k)] over every position
(vLLM's mean acceptance length counts the bonus token the same way); ``served`` replays
the positions greedy speculative decoding actually drafts at (after a steps with a
accepted tokens the next draft starts a + 1 later), which is what vLLM's counters see.
"""

from __future__ import annotations

import os

import torch
from tqdm import tqdm

from vllm_k2_plugin import fileio

from .export import load_export
from .shards import ShardReader
from .target_weights import LM_HEAD, load_tensor
from .ttt import Batch, unroll


@torch.no_grad()
def accepted_runs(model, lm_head: torch.Tensor, sample: dict, k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted-run length (0..k_max) at every position of one sample, and which positions
    start a draft inside an assistant span."""
    final = sample["final"].float()
    greedy_next = (final @ lm_head.t()).argmax(-1)  # token the target emits after position p
    t = len(greedy_next)
    mask = sample["loss_mask"].bool()
    batch = Batch(sample["input_ids"][None], sample["aux"].float()[None], final[None], mask.float()[None])
    hits = []
    for j, h_pre, _, _ in unroll(model, batch, k_max):
        draft = model.draft_to_target(model.logits(h_pre)[0].argmax(-1))  # prediction for position t+2+j
        want = torch.full_like(draft, -1)
        n = max(0, t - 1 - j)
        want[:n] = greedy_next[1 + j : 1 + j + n]  # the target's token at t+2+j = greedy_next[t+1+j]
        valid = torch.zeros_like(mask)
        valid[: max(0, t - 2 - j)] = mask[2 + j :]
        hits.append((draft == want) & valid)
    hits = torch.stack(hits, dim=1)  # [T, k_max]
    runs = hits.int().cumprod(dim=1).sum(dim=1)
    starts = torch.zeros_like(mask)
    starts[: max(0, t - 2)] = mask[2:]
    return runs, starts


def served_runs(runs: torch.Tensor, starts: torch.Tensor, k: int) -> list[int]:
    """The accepted runs vLLM itself would see: drafting starts where the target emitted the
    answer's first token, and after a step that accepted a tokens the next draft starts
    a + 1 positions later (the accepted tokens plus the target's own)."""
    idx = starts.nonzero().flatten().tolist()
    if not idx:
        return []
    out, t = [], idx[0] + 1  # idx[0] predicts the answer's first token, which the prefill emits
    while t < len(starts) and starts[t]:
        a = min(int(runs[t]), k)
        out.append(a)
        t += a + 1
    return out


def evaluate(export_dir: str, target: str, extract_dir: str, out_dir: str, k_max: int = 5) -> dict:
    model = load_export(export_dir, target)
    lm_head = load_tensor(target, LM_HEAD).float()
    data = ShardReader(extract_dir)
    per_sample = [
        accepted_runs(model, lm_head, data.sample(i), k_max) for i in tqdm(range(len(data)), desc="eval", unit="sample")
    ]
    runs = torch.cat([r[s] for r, s in per_sample])
    if runs.numel() == 0:
        raise ValueError(f"{extract_dir}: no assistant positions to evaluate")
    per_pos = [float((runs > j).float().mean()) for j in range(k_max)]  # P(first j+1 accepted), vLLM's per-position
    tau = {str(k): 1.0 + float(runs.clamp(max=k).float().mean()) for k in range(1, k_max + 1)}
    # What vLLM's counters report for greedy decoding of these answers (drafts only where
    # verification lands), per k: mean acceptance length and per-position acceptance.
    served = {}
    for k in range(1, k_max + 1):
        steps = [a for r, s in per_sample for a in served_runs(r, s, k)]
        served[str(k)] = {
            "tau": 1.0 + sum(steps) / max(1, len(steps)),
            "per_position": [sum(a > j for a in steps) / max(1, len(steps)) for j in range(k)],
            "drafts": len(steps),
        }
    result = {
        "export": os.path.abspath(export_dir),
        "eval_data": os.path.abspath(extract_dir),
        "positions": int(runs.numel()),
        "samples": len(data),
        "per_position_acceptance": per_pos,
        "conditional_acceptance": [per_pos[0]]
        + [per_pos[j] / per_pos[j - 1] if per_pos[j - 1] else 0.0 for j in range(1, k_max)],
        "tau": tau,
        "served": served,
    }
    os.makedirs(out_dir, exist_ok=True)
    fileio.write_json(os.path.join(out_dir, "eval.json"), result)
    plot(result, os.path.join(out_dir, "acceptance.png"))
    return result


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    pos = list(range(1, len(result["per_position_acceptance"]) + 1))
    a.bar(pos, result["per_position_acceptance"], color="tab:blue")
    a.set_xlabel("draft position")
    a.set_ylabel("acceptance (first j accepted)")
    a.set_ylim(0, 1)
    a.set_xticks(pos)
    ks = [int(k) for k in result["tau"]]
    b.plot(ks, [result["tau"][str(k)] for k in ks], marker="o")
    b.set_xlabel("draft tokens k")
    b.set_ylabel("mean acceptance length tau")
    b.set_xticks(ks)
    fig.suptitle(f"offline EAGLE-3 acceptance ({result['positions']} positions)")
    fig.tight_layout()
    fileio.write_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
