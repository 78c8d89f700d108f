"""Read chat datasets from local files into one layout: a list of {"role", "content"}.

Accepted layouts, per JSON line (``.jsonl``) or per row of a local ``datasets`` dataset
(a directory written by ``Dataset.save_to_disk``):

* messages / OpenAI:  {"messages": [{"role": "user"|"assistant"|"system", "content": str}, ...]}
* ShareGPT:           {"conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}
* UltraChat (raw):    {"data": [user, assistant, user, assistant, ...]}

Every malformed record raises ``ChatFormatError`` naming the file, the line (or row)
and the field: nothing is skipped silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
ROLES = {"user", "assistant", "system"}


class ChatFormatError(ValueError):
    pass


def normalize(record: dict, where: str) -> list[dict]:
    """One record in any accepted layout -> [{"role", "content"}], validated."""
    if not isinstance(record, dict):
        raise ChatFormatError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list):
            raise ChatFormatError(f"{where}: field 'messages' must be a list")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ChatFormatError(f"{where}: messages[{i}] needs 'role' in {sorted(ROLES)} and a string 'content'")
            out.append({"role": m["role"], "content": m["content"]})
    elif "conversations" in record:
        out = []
        for i, m in enumerate(record["conversations"] or []):
            role = SHAREGPT_ROLES.get(m.get("from")) if isinstance(m, dict) else None
            if role is None or not isinstance(m.get("value"), str):
                raise ChatFormatError(
                    f"{where}: conversations[{i}] needs 'from' in {sorted(SHAREGPT_ROLES)} and a string 'value'"
                )
            out.append({"role": role, "content": m["value"]})
    elif "data" in record:
        turns = record["data"]
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise ChatFormatError(f"{where}: field 'data' must be a list of strings (user, assistant, ...)")
        out = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    else:
        raise ChatFormatError(f"{where}: no 'messages', 'conversations' or 'data' field (keys: {sorted(record)})")
    if not any(m["role"] == "assistant" for m in out):
        raise ChatFormatError(f"{where}: the conversation has no assistant turn to train on")
    return out


def read_chats(path: str) -> Iterator[tuple[str, list[dict]]]:
    """Yield (where, messages) from a .jsonl/.json file or a saved `datasets` directory."""
    if os.path.isdir(path):
        import datasets

        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            raise ChatFormatError(f"{path}: a DatasetDict ({list(ds)}); pass the split's directory")
        for i, row in enumerate(ds):
            yield f"{path}[row {i}]", normalize(row, f"{path}[row {i}]")
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"chat data file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            try:
                records = json.load(f)
            except json.JSONDecodeError as e:
                raise ChatFormatError(f"{path}: not valid JSON ({e})") from e
            if not isinstance(records, list):
                raise ChatFormatError(f"{path}: a .json file must hold a list of conversations")
            for i, rec in enumerate(records):
                yield f"{path}[{i}]", normalize(rec, f"{path}[{i}]")
            return
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ChatFormatError(f"{path}:{n}: not valid JSON ({e.msg})") from e
            yield f"{path}:{n}", normalize(rec, f"{path}:{n}")
