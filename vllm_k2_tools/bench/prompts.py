"""Built-in prompt set: chat, code and math, as single-turn chat messages."""

from __future__ import annotations

import json

BUILTIN: list[dict] = [
    {"kind": "chat", "prompt": "Write a short, friendly reply to a colleague asking how the project is going."},
    {"kind": "chat", "prompt": "Explain to a ten-year-old why the sky is blue."},
    {"kind": "chat", "prompt": "Summarise the plot of Romeo and Juliet in three sentences."},
    {"kind": "code", "prompt": "Write a Python function that returns the n-th Fibonacci number iteratively."},
    {"kind": "code", "prompt": "Write a SQL query returning the ten customers with the highest total order value."},
    {"kind": "code", "prompt": "Implement binary search in C and explain its complexity."},
    {"kind": "math", "prompt": "What is 12 times 7? Show the steps."},
    {"kind": "math", "prompt": "Solve for x: 3x + 5 = 20. Explain each step."},
    {"kind": "math", "prompt": "A train travels 120 km in 1.5 hours. What is its average speed in km/h?"},
]


def random_token_prompts(tokenizer_dir: str, n: int = 12, length: int = 48, seed: int = 0) -> list[dict]:
    """Prompts of uniformly random token ids (decoded with the target's tokenizer): text no
    drafter has a pattern for, so drafts are (nearly) never accepted."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    rng = random.Random(seed)
    return [{"kind": "random", "prompt": tok.decode(rng.choices(ids, k=length))} for _ in range(n)]


def load_prompts(path: str | None, model: str | None = None) -> list[dict]:
    """The built-in set; ``random[:N]``: N prompts of random token ids of ``model``'s
    tokenizer; or a user file: JSONL of {"prompt": ...} (optional "kind") or plain text,
    one prompt per line."""
    if not path:
        return list(BUILTIN)
    if path == "random" or path.startswith("random:"):
        n = int(path.split(":", 1)[1]) if ":" in path else 12
        if model is None:
            raise ValueError("--prompts random needs the target model (its tokenizer)")
        return random_token_prompts(model, n)
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: invalid JSON ({e})") from e
                if "prompt" not in row:
                    raise ValueError(f"{path}:{n}: field 'prompt' is missing")
                out.append({"kind": row.get("kind", "user"), "prompt": str(row["prompt"])})
            else:
                out.append({"kind": "user", "prompt": line})
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out
