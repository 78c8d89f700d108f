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


def load_prompts(path: str | None) -> list[dict]:
    """The built-in set, or a user file: JSONL of {"prompt": ...} (optional "kind") or
    plain text, one prompt per line."""
    if not path:
        return list(BUILTIN)
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
