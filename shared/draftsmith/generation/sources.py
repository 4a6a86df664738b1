"""Prompt sources: local JSONL / JSON / Parquet files, local dataset folders and Hugging Face dataset names.

Accepted row shapes (first match wins): EAGLE / MT-bench ``turns`` (list of user turns), OpenAI ``messages``,
ShareGPT ``conversations`` (``from``/``value``), ``question``, ``instruction`` (+ ``input``, or the first of
Self-Instruct's ``instances[].input``), ``prompt``. Assistant turns in a row are dropped: the target regenerates them.
So are ``tool`` / ``function`` turns and assistant ``tool_calls`` (their ``content`` may be null); OpenAI content
given as a list of parts keeps its text parts (a user turn with an image or audio part is refused as
``non_text_content``: its text alone is not the prompt); ShareGPT ``conversations`` stored as a JSON string are
parsed. A turn whose text already holds chat-template markup (``<|im_start|>``, ``<|start_header_id|>``, ``[INST]``,
...) is refused as ``template_markup``: the server would wrap it in the template a second time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.errors import SourceError
from draftsmith.log import get_logger

log = get_logger(__name__)

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
                   "system": "system", "tool": "tool", "function": "tool", "observation": "tool",
                   "function_call": "assistant"}


@dataclass
class Prompt:
    """One unique prompt: its stable id, its messages (system/user only) and where it came from."""

    id: str
    messages: list[dict[str, str]]
    source: str
    row: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages, "source": self.source, "row": self.row}


@dataclass
class ExtractResult:
    """Prompts extracted from a source plus the rows skipped, counted by reason."""

    prompts: list[Prompt] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    rows_read: int = 0
    duplicates: int = 0
    unique: int = 0  # unique prompts seen (all of the source's when a limit is sampled)


def prompt_id(messages: list[dict[str, str]]) -> str:
    """Stable id of a prompt: sha256 of its normalised messages (JSON, sorted keys), first 16 hex digits."""
    norm = [{"role": m["role"], "content": m["content"].strip()} for m in messages]
    blob = json.dumps(norm, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


# Control tokens of the chat templates in use (ChatML/Qwen, Llama-3, Llama-2/Mistral, DeepSeek, Kimi, gpt-oss
# harmony, Gemma, Phi-3/Zephyr). Text holding one of them was rendered with a template already.
TEMPLATE_MARKUP = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|start_header_id\|>|<\|end_header_id\|>|<\|eot_id\|>|<\|begin_of_text\|>"
    r"|\[INST\]|\[/INST\]|<<SYS>>|<｜User｜>|<｜Assistant｜>|<\|im_user\|>|<\|im_assistant\|>|<\|im_middle\|>"
    r"|<\|start\|>(?:system|user|assistant|developer)|<\|channel\|>|<start_of_turn>|<end_of_turn>"
    r"|<\|(?:user|assistant|system)\|>\s*\n"
)
_DROPPED_ROLES = {"assistant", "tool", "function", "ipython"}


def template_markup(text: str) -> str | None:
    """The first chat-template control token found in ``text`` (e.g. ``<|im_start|>``), or None."""
    m = TEMPLATE_MARKUP.search(text)
    return m.group(0).strip() if m else None


def _content_text(content: Any) -> str | None:
    """The text of an OpenAI message ``content``: a string, or the joined ``text`` parts of a list of parts.

    Returns None when the content is not text (null, a number) and raises :class:`RowError`
    (``non_text_content``) when a list holds an image/audio/file part.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise RowError("non_text_content")
        return "\n".join(texts)
    return None


class RowError(ValueError):
    """A row that yields no prompt; ``reason`` is the counter key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def row_to_messages(row: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """Turn one source row into prompt messages (system and user turns, in order).

    Raises:
        RowError: ``not_an_object``, ``unknown_shape``, ``bad_turns``, ``non_text_content``, ``template_markup`` or
            ``empty_prompt``.
    """
    if not isinstance(row, dict):
        raise RowError("not_an_object")
    msgs: list[dict[str, str]]
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise RowError("bad_turns")
        msgs = [{"role": "user", "content": t} for t in turns]
    elif "messages" in row or "conversations" in row:
        raw = row.get("messages", row.get("conversations"))
        if isinstance(raw, str):  # ShareGPT dumps that store the conversation as a JSON string
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise RowError("bad_turns") from None
        if not isinstance(raw, list):
            raise RowError("bad_turns")
        msgs = []
        for m in raw:
            if not isinstance(m, dict):
                raise RowError("bad_turns")
            if "role" in m:
                role, content = m.get("role"), m.get("content")
            else:
                role, content = _SHAREGPT_ROLES.get(str(m.get("from", "")).lower()), m.get("value")
            role = "system" if role == "developer" else role
            if role in _DROPPED_ROLES:
                continue  # regenerated by the target (assistant) or not a prompt (tool results, tool_calls)
            text = _content_text(content) if role in ("system", "user") else None
            if text is None:
                raise RowError("bad_turns")
            msgs.append({"role": role, "content": text})
    elif isinstance(row.get("question"), str):
        msgs = [{"role": "user", "content": row["question"]}]
    elif isinstance(row.get("instruction"), str):
        extra = row.get("input")
        if extra is None and isinstance(row.get("instances"), list) and row["instances"]:
            first = row["instances"][0]
            extra = first.get("input") if isinstance(first, dict) else None
        text = row["instruction"].strip()
        if isinstance(extra, str) and extra.strip():
            text = f"{text}\n\n{extra.strip()}"
        msgs = [{"role": "user", "content": text}]
    elif isinstance(row.get("prompt"), str):
        msgs = [{"role": "user", "content": row["prompt"]}]
    else:
        raise RowError("unknown_shape")
    msgs = [{"role": m["role"], "content": m["content"].strip()} for m in msgs]
    msgs = [m for m in msgs if m["content"]]
    if any(template_markup(m["content"]) for m in msgs):
        raise RowError("template_markup")
    if not any(m["role"] == "user" for m in msgs):
        raise RowError("empty_prompt")
    if system_prompt and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return msgs


def _iter_jsonl(path: Path, skipped: Counter) -> Iterator[Any]:
    with open(path, encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                skipped["malformed_json"] += 1
                log.debug("%s:%d is not valid JSON", path, lineno)


def load_rows(source: str, split: str = "train") -> tuple[list[Any], Counter]:
    """Read every row of ``source``; returns the rows and the malformed ones counted by reason.

    ``source`` is a local ``.jsonl``/``.json``/``.parquet`` file, a local dataset folder (``save_to_disk`` output
    or a folder of data files), or a Hugging Face dataset name (needs the hub or its local cache).

    Raises:
        SourceError: the source cannot be found or read (the message says which and what to pass instead).
    """
    skipped: Counter = Counter()
    path = Path(source).expanduser()
    try:
        if path.is_file():
            suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
            if suffix in (".jsonl", ".ndjson"):
                return list(_iter_jsonl(path, skipped)), skipped
            if suffix == ".json":
                try:
                    obj = json.loads(path.read_text(encoding="utf-8"))
                except json.JSONDecodeError:
                    # a .json file that is really JSON lines
                    return list(_iter_jsonl(path, skipped)), skipped
                if isinstance(obj, dict):
                    for key in ("data", "rows", "train", "questions"):
                        if isinstance(obj.get(key), list):
                            return obj[key], skipped
                    raise SourceError(f"{path} holds a JSON object, not a list of rows",
                                      "put the rows in a top-level list (or under 'data')")
                if isinstance(obj, list):
                    return obj, skipped
                raise SourceError(f"{path} holds no list of rows")
            if suffix == ".parquet":
                import pyarrow.parquet as pq

                return pq.read_table(path).to_pylist(), skipped
            raise SourceError(f"{path}: unknown file type {suffix!r}", "use .jsonl, .json or .parquet")
        if path.is_dir():
            import datasets

            if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
                ds = datasets.load_from_disk(str(path))
            else:
                ds = datasets.load_dataset(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise SourceError(f"{path} has no split {split!r}", f"choose one of {list(ds)}")
                ds = ds[split]
            return ds.to_list(), skipped
        if path.suffix or source.startswith((".", "/", "~")):
            raise SourceError(f"source {source} does not exist", "pass an existing file, folder or dataset name")
        import datasets

        ds = datasets.load_dataset(source, split=split)
        return ds.to_list(), skipped
    except SourceError:
        raise
    except UnicodeDecodeError as e:
        raise SourceError(f"{source} is not UTF-8 text ({e.reason})", "convert it to UTF-8") from e
    except Exception as e:  # datasets/pyarrow raise many types; all mean "cannot read this source"
        raise SourceError(
            f"cannot load {source!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            "for a hub dataset, the machine needs the hub or a local copy (pass its folder)",
        ) from e


def extract_prompts(source: str, limit: int | None = None, split: str = "train",
                    system_prompt: str | None = None, sample_seed: int | None = None) -> ExtractResult:
    """Extract up to ``limit`` unique prompts from ``source``.

    With ``sample_seed`` None the first ``limit`` unique prompts in source order are taken; with a seed, ``limit``
    of all the source's unique prompts are drawn at random (reservoir sampling, the same seed gives the same
    sample) and returned in source order. A mixture stored source by source then keeps its proportions, which
    its first rows do not. ``rows_read`` and ``skipped`` count every row read (all of them when sampling).

    Raises:
        SourceError: the source cannot be read, or no row yields a usable prompt.
    """
    import random

    rows, skipped = load_rows(source, split)
    result = ExtractResult(skipped=skipped)
    seen: set[str] = set()
    rng = random.Random(sample_seed)
    sampling = sample_seed is not None and limit is not None
    for i, row in enumerate(rows):
        result.rows_read += 1
        try:
            msgs = row_to_messages(row, system_prompt)
        except RowError as e:
            result.skipped[e.reason] += 1
            continue
        pid = prompt_id(msgs)
        if pid in seen:
            result.duplicates += 1
            continue
        seen.add(pid)
        prompt = Prompt(pid, msgs, str(source), i)
        if sampling and len(result.prompts) >= limit:
            j = rng.randrange(len(seen))  # Algorithm R: the k-th unique prompt stays with probability limit/k
            if j < limit:
                result.prompts[j] = prompt
            continue
        result.prompts.append(prompt)
        if not sampling and limit is not None and len(result.prompts) >= limit:
            break
    result.unique = len(seen)
    if sampling:
        result.prompts.sort(key=lambda p: p.row)
    if not result.prompts:
        reasons = ", ".join(f"{k}={v}" for k, v in result.skipped.items()) or "no rows"
        raise SourceError(
            f"no usable prompt in {source} ({reasons})",
            "rows need one of: turns, messages, conversations, question, instruction, prompt",
        )
    return result
