"""Prompt sets, as single-turn chat messages: the built-in chat/code/math set, random token ids,
a serving-load set (shared prefixes, short to long, half sampled with seeds), or a user file.

A prompt is {"kind", "prompt"} plus, optionally, how it is sampled: "temperature" (default 0:
greedy, the only requests whose outputs must match across modes) and "seed"."""

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


#: the serving-load set's shared heads: requests of one conversation style share their prefix
#: (what prefix caching serves), each head followed by a task of its own
LOAD_HEADS = [
    "You are a careful senior Python reviewer. Read the request and answer with working code only.\n\n",
    "You are a patient maths tutor. Work through the problem step by step and give the result last.\n\n",
    "You are a support engineer. Answer the customer briefly and politely, then list next steps.\n\n",
]
LOAD_BODY = "The input may be large and the code must stay readable; mention edge cases. "


def load_set(n: int = 24, seed: int = 0) -> list[dict]:
    """``n`` prompts for a serving load: each starts with one of three shared heads, carries a
    task of its own padded from short to long (1 ... 16 repeats of a body sentence), and every
    other prompt is sampled (temperature 0.8) with its own seed; the rest are greedy."""
    import random

    rng = random.Random(seed)
    tasks = [p["prompt"] for p in BUILTIN]
    out = []
    for i in range(n):
        head = LOAD_HEADS[i % len(LOAD_HEADS)]
        body = LOAD_BODY * (1 << rng.randrange(5))  # 1, 2, 4, 8 or 16 repeats
        prompt = {"kind": "load", "prompt": head + tasks[i % len(tasks)] + " " + body}
        if i % 2:
            prompt.update(kind="load-sampled", temperature=0.8, seed=1000 + i)
        out.append(prompt)
    return out


def _sampling(row: dict, where: str) -> dict:
    out = {}
    if "temperature" in row:
        t = row["temperature"]
        if not isinstance(t, int | float) or t < 0:
            raise ValueError(f"{where}: field 'temperature' must be a number >= 0, got {t!r}")
        out["temperature"] = float(t)
    if "seed" in row:
        if not isinstance(row["seed"], int):
            raise ValueError(f"{where}: field 'seed' must be an integer, got {row['seed']!r}")
        out["seed"] = row["seed"]
    return out


def load_prompts(path: str | None, model: str | None = None) -> list[dict]:
    """The built-in set; ``random[:N]``: N prompts of random token ids of ``model``'s
    tokenizer; ``load[:N]``: the serving-load set (``load_set``); or a user file: JSONL of
    {"prompt": ...} (optional "kind", "temperature", "seed") or plain text, one prompt per line."""
    if not path:
        return list(BUILTIN)
    if path == "load" or path.startswith("load:"):
        return load_set(int(path.split(":", 1)[1]) if ":" in path else 24)
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
                out.append(
                    {"kind": row.get("kind", "user"), "prompt": str(row["prompt"]), **_sampling(row, f"{path}:{n}")}
                )
            else:
                out.append({"kind": "user", "prompt": line})
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out
