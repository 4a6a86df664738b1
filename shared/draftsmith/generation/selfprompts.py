"""Self-generated prompts: user requests written by the target itself (Magpie).

The target's chat template is rendered up to the point where a user message's text begins (with the default system
prompt the template inserts, if any) and the target completes that text: what it writes is a user request of the
kind its own instruction tuning saw (open writing, advice, role-play, code questions), which the bundled pools lack.
The generator then answers each request with the same target, so the drafter trains on conversations of the target's
own distribution on both sides. A request the target cut off, a near-empty or runaway one, one in another script than
the target's, one holding template markup or sharing an 8-word run with an eval set's prompt is dropped.

Source: Xu et al., "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"
(arXiv:2406.08464, 2024): the pre-query template, sampled at temperature 1 / top-p 0.99 there; 0.9 here, because a
135M target wanders off at a wider nucleus (seen on SmolLM2-135M-Instruct: docs/generation.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from draftsmith.artifacts.storage import atomic_write_text
from draftsmith.errors import ConfigError, DataError, TargetUnavailable
from draftsmith.evaluation.sets import KNOWN_SETS, load_set
from draftsmith.generation.sources import template_markup
from draftsmith.log import get_logger

log = get_logger(__name__)

_SENTINEL = "\u2063DRAFTSMITH_USER_TEXT\u2063"
_WORD = re.compile(r"[a-z0-9]+")
SHINGLE = 8  # words in a run shared with an eval prompt that count as overlap (a prompt or a long quote of one)


def user_turn_prefix(tokenizer) -> str:
    """The chat template rendered up to where a user message's text starts (the Magpie pre-query template).

    Args:
        tokenizer: a transformers tokenizer with a chat template (the target's).

    Returns:
        Text such as ``<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n`` for ChatML; the target completes it
        with a user request and ends it with its end-of-turn token.

    Raises:
        ConfigError: the template does not render a user message's text verbatim (it cannot be cut there).
    """
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                             add_generation_prompt=False)
    if _SENTINEL not in rendered:
        raise ConfigError("the target's chat template does not render a user message's text verbatim",
                          "self-generated prompts need a template that does; use prompt files instead")
    prefix = rendered[: rendered.index(_SENTINEL)]
    if not prefix.strip():
        raise ConfigError("the target's chat template puts nothing before a user message",
                          "self-generated prompts need a template that marks the user turn; use prompt files")
    return prefix


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class EvalOverlap:
    """Which texts share a run of :data:`SHINGLE` words with an evaluation prompt (contamination check).

    Args:
        turns: the user turns of the eval sets (every turn of every prompt).
    """

    def __init__(self, turns: Iterable[str]) -> None:
        self.shingles: set[tuple[str, ...]] = set()
        for t in turns:
            w = _words(t)
            self.shingles.update(tuple(w[i:i + SHINGLE]) for i in range(max(1, len(w) - SHINGLE + 1)))

    @classmethod
    def bundled(cls) -> EvalOverlap:
        """The check against every bundled eval set (:data:`draftsmith.evaluation.sets.KNOWN_SETS`)."""
        return cls(t for name in KNOWN_SETS for p in load_set(name).prompts for t in p.turns)

    def hits(self, text: str) -> bool:
        """True when ``text`` shares :data:`SHINGLE` consecutive words (or all of a shorter eval prompt)."""
        w = _words(text)
        return any(tuple(w[i:i + SHINGLE]) in self.shingles for i in range(max(1, len(w) - SHINGLE + 1)))


def rejection(text: str, finish_reason: str | None, min_words: int = 4, max_chars: int = 2000) -> str | None:
    """Why a generated user request is not kept, or None to keep it.

    Reasons: ``cut_off`` (the target hit the token limit before ending its turn), ``too_short`` (fewer than
    ``min_words`` words), ``too_long`` (over ``max_chars`` characters), ``script`` (over 10% of its letters outside
    Latin script: SmolLM2 is an English model and such requests are mostly its noise), ``template_markup``.
    """
    if finish_reason != "stop":
        return "cut_off"
    if len(text.split()) < min_words:
        return "too_short"
    if len(text) > max_chars:
        return "too_long"
    letters = [c for c in text if c.isalpha()]
    if letters and sum(1 for c in letters if ord(c) > 0x24F) > 0.1 * len(letters):
        return "script"
    if template_markup(text):
        return "template_markup"
    return None


def _norm(text: str) -> str:
    return " ".join(_words(text))


@dataclass
class SelfPromptReport:
    """What :func:`synthesize` did: rows in the file, rows added now, requests sent, rejections by reason."""

    path: Path
    rows: int
    added: int
    requests: int
    completions: int
    rejected: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    def line(self) -> str:
        """One line for the log and the CLI."""
        rej = ", ".join(f"{k} {v}" for k, v in self.rejected.most_common()) or "none"
        return (f"{self.rows} self-generated prompts in {self.path} ({self.added} new from {self.completions} "
                f"completions in {self.requests} requests, {self.seconds:.0f} s; rejected: {rej})")


def read_pool(path: Path) -> list[dict]:
    """The rows of a self-generated pool (``{"id", "prompt"}`` per line); a torn last line is ignored."""
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("prompt"), str):
                rows.append(row)
    return rows


def synthesize(url: str, model: str, prefix: str, n: int, path: Path, *, seed: int = 0, temperature: float = 1.0,
               top_p: float = 0.9, max_tokens: int = 160, per_request: int = 32, api_key: str | None = None,
               overlap: EvalOverlap | None = None, timeout_s: float = 600.0, parallel: int = 4,
               say: Callable[[str], None] = lambda m: None) -> SelfPromptReport:
    """Have the target write ``n`` user requests (Magpie) into the JSONL pool ``path``; resumable.

    Rows already in ``path`` count toward ``n`` (a rerun adds only what is missing; each request's seed is derived
    from ``seed`` and the pool's state, so the same state asks the same). Up to ``parallel`` requests of ``per_request`` samples are in flight at
    once; the file is rewritten atomically after every round, so an interrupted run keeps what it had. Requests go
    to the server's ``/v1/completions`` with the raw ``prefix`` (``user_turn_prefix``).

    Args:
        url: the target server (OpenAI-compatible).
        model: the served model name.
        prefix: the chat template cut before the user text.
        n: rows wanted in the pool.
        path: the pool file, one ``{"id": "self-<sha256[:16]>", "prompt": text}`` per line.
        overlap: the eval-set contamination check (default: every bundled eval set).

    Returns:
        A :class:`SelfPromptReport`.

    Raises:
        TargetUnavailable: the server does not answer or answers an error.
        DataError: after 4x the requests ``n`` should need, fewer than ``n`` requests were kept (the file keeps them).
    """
    t0 = time.monotonic()
    overlap = overlap or EvalOverlap.bundled()
    rows = read_pool(path)
    seen = {_norm(r["prompt"]) for r in rows}
    report = SelfPromptReport(path=path, rows=len(rows), added=0, requests=0, completions=0)
    need_requests = -(-n // per_request)
    budget = 4 * need_requests + 2
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers,
                      transport=httpx.HTTPTransport(retries=3)) as client, ThreadPoolExecutor(parallel) as pool:

        def complete(req_seed: int) -> list[dict]:
            body = {"model": model, "prompt": prefix, "n": per_request, "temperature": temperature, "top_p": top_p,
                    "max_tokens": max_tokens, "seed": req_seed, "skip_special_tokens": True}
            try:
                resp = client.post("/v1/completions", json=body)
            except httpx.HTTPError as e:
                raise TargetUnavailable(f"the target at {url} did not answer a completion request: {e}",
                                        "start it (`draftsmith target serve`) or pass the right --url; the pool "
                                        f"keeps its {len(rows)} rows") from e
            if resp.status_code != 200:
                raise TargetUnavailable(f"the target at {url} answered HTTP {resp.status_code}: {resp.text[:300]}",
                                        "check the server log; the pool keeps its rows")
            return resp.json().get("choices", [])

        while len(rows) < n and report.requests < budget:
            # enough requests at once for what is missing (a server batches them), in a fixed seed order
            k = min(parallel, -(-(n - len(rows)) // per_request), budget - report.requests)
            seeds = [seed * 100003 + len(rows) * 7 + report.requests + j for j in range(k)]
            for choices in pool.map(complete, seeds):
                report.requests += 1
                for choice in choices:
                    if len(rows) >= n:
                        break
                    report.completions += 1
                    text = (choice.get("text") or "").strip()
                    why = rejection(text, choice.get("finish_reason"))
                    if why is None and overlap.hits(text):
                        why = "eval_overlap"
                    if why is None and _norm(text) in seen:
                        why = "duplicate"
                    if why:
                        report.rejected[why] += 1
                        continue
                    seen.add(_norm(text))
                    rows.append({"id": "self-" + hashlib.sha256(text.encode()).hexdigest()[:16], "prompt": text})
                    report.added += 1
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            say(f"self-generated prompts: {len(rows)} / {n}")
    report.rows = len(rows)
    report.seconds = time.monotonic() - t0
    log.info("%s", report.line())
    if len(rows) < n:
        raise DataError(f"the target wrote only {len(rows)} usable prompts of {n} in {report.requests} requests "
                        f"(rejected: {dict(report.rejected)})",
                        "ask for fewer, or raise --temperature/--top-p a little; the rows kept are in "
                        f"{path}")
    return report
