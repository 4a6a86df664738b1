"""Send evaluation prompts to an engine at a fixed concurrency and temperature; measure acceptance and speed.

For each set, the engine's counters are read before and after (vLLM: ``vllm:spec_decode_*``; SGLang: the
per-request ``meta_info`` of that set's requests), so each set's acceptance is its own. Multi-turn prompts
(MT-bench) are answered turn by turn, each answer appended to the conversation before the next user turn, as in
EAGLE's ``gen_ea_answer`` scripts. Output tokens/s = completion tokens of the set / wall time of the set.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from draftsmith.data.render import load_tokenizer
from draftsmith.errors import EngineError
from draftsmith.evaluation.prom import fetch
from draftsmith.evaluation.sets import EvalPrompt, EvalSet
from draftsmith.evaluation.sglang import acceptance_from_meta_infos, parse_sglang_metrics
from draftsmith.evaluation.vllm_metrics import Acceptance, SpecCounters, acceptance_from_counters
from draftsmith.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Turn:
    """One generated assistant turn: its text, completion tokens, the engine's per-request info (SGLang), the
    generated target token ids where the engine reports them (vLLM ``return_token_ids``) and vLLM's per-request
    speculative metrics (``metrics.speculative_decoding``: ``num_spec_steps``, ``num_accepted_draft_tokens``...)
    where the server runs with ``--per-request-spec-decode-metrics``."""

    text: str
    completion_tokens: int
    meta_info: dict[str, Any] | None = None
    token_ids: tuple[int, ...] | None = None
    spec_metrics: dict[str, Any] | None = None


class EngineClient(Protocol):
    """What the runner needs from an engine."""

    engine: str
    url: str

    def generate(self, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> Turn: ...

    def counters(self) -> Any: ...


def _post(client: httpx.Client, url: str, body: dict[str, Any], retries: int = 2) -> dict[str, Any]:
    for attempt in range(retries + 1):
        try:
            r = client.post(url, json=body)
        except httpx.TransportError as e:
            if attempt == retries:
                raise EngineError(f"the engine at {url} does not answer ({type(e).__name__}: {e})") from e
            time.sleep(1.0 + attempt)
            continue
        if r.status_code >= 400:
            raise EngineError(
                f"the engine at {url} answered HTTP {r.status_code}: {r.text[:300]}",
                "lower --max-tokens or check the server log",
            )
        return r.json()
    raise AssertionError("unreachable")


class VLLMClient:
    """OpenAI chat completions on a vLLM server; acceptance from its ``/metrics`` counters."""

    engine = "vllm"

    def __init__(self, url: str, model: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def generate(self, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> Turn:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                "seed": 0, "return_token_ids": True}
        out = _post(self._http, f"{self.url}/v1/chat/completions", body)
        choice = out["choices"][0]
        ids = choice.get("token_ids")
        return Turn(choice["message"].get("content") or "", int(out["usage"]["completion_tokens"]),
                    token_ids=tuple(ids) if ids is not None else None,
                    spec_metrics=(out.get("metrics") or {}).get("speculative_decoding"))

    def counters(self) -> SpecCounters:
        return SpecCounters.from_text(fetch(self.url), self.model)


class SGLangClient:
    """SGLang's native ``/generate`` (it returns ``meta_info`` with ``spec_verify_ct``; its OpenAI endpoint drops
    it). The prompt is rendered with the target tokenizer's own chat template."""

    engine = "sglang"

    def __init__(self, url: str, tokenizer_dir: Path, timeout_s: float = 600.0, trust_remote_code: bool = False) -> None:
        self.url = url.rstrip("/")
        self.tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def generate(self, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> Turn:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        body = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature}}
        out = _post(self._http, f"{self.url}/generate", body)
        meta = out.get("meta_info") or {}
        return Turn(out.get("text", ""), int(meta.get("completion_tokens", 0)), meta)

    def counters(self) -> Any:
        return parse_sglang_metrics(fetch(self.url))


@dataclass
class SetMeasure:
    """What one set measured on one engine (``acceptance`` is None for a baseline run without drafter)."""

    name: str
    requests: int = 0
    turns: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    acceptance: Acceptance | None = None
    engine_figure: float | None = None  # the engine's own accept-length figure, for the report's cross-check
    counters: Any = None
    metas: list[dict[str, Any]] = field(default_factory=list)
    in_draft_vocab: int | None = None  # generated tokens inside the drafter's draft vocabulary (None: not known)
    counted_tokens: int = 0  # generated tokens whose ids the engine reported (the coverage denominator)

    @property
    def draft_vocab_coverage(self) -> float | None:
        """Share of the target's generated tokens that lie in the draft vocabulary (0..1): a token outside it can
        never be drafted, so it bounds the acceptance of every position."""
        if self.in_draft_vocab is None or not self.counted_tokens:
            return None
        return self.in_draft_vocab / self.counted_tokens

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else None


def _answer(client: EngineClient, prompt: EvalPrompt, max_tokens: int, temperature: float,
            system: str | None) -> list[Turn]:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    turns: list[Turn] = []
    for user in prompt.turns:
        messages.append({"role": "user", "content": user})
        t = client.generate(messages, max_tokens, temperature)
        messages.append({"role": "assistant", "content": t.text})
        turns.append(t)
    return turns


def run_set(client: EngineClient, eval_set: EvalSet, k: int, concurrency: int = 1, temperature: float = 0.0,
            max_tokens: int = 256, system: str | None = None, speculative: bool = True,
            draft_vocab: frozenset[int] | None = None) -> SetMeasure:
    """Answer every prompt of a set and measure it.

    Args:
        client: the engine (:class:`VLLMClient` or :class:`SGLangClient`).
        eval_set: the prompts.
        k: speculative tokens per step (for per-position figures).
        concurrency: prompts in flight at once (a prompt's turns stay sequential).
        temperature: sampling temperature (0 = greedy, the standard for acceptance).
        max_tokens: most new tokens per assistant turn.
        system: optional system message.
        speculative: False for a baseline run (no drafter): no acceptance is read.
        draft_vocab: target ids of the drafter's draft vocabulary (``t2d``'s true entries); with it, the share of
            generated tokens inside it is measured (:attr:`SetMeasure.draft_vocab_coverage`) where the engine
            reports token ids.

    Returns:
        :class:`SetMeasure`.

    Raises:
        EngineError: the engine failed a request, or exposes no speculative counters while ``speculative``.
    """
    m = SetMeasure(name=eval_set.name, requests=len(eval_set.prompts))
    before = client.counters() if speculative and client.engine == "vllm" else None
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        try:
            results = list(pool.map(lambda p: _answer(client, p, max_tokens, temperature, system), eval_set.prompts))
        except BaseException:  # a signal or a failed prompt: leaving the block would answer every queued prompt
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    m.wall_s = time.perf_counter() - t0
    turns = [t for r in results for t in r]
    m.turns = len(turns)
    m.output_tokens = sum(t.completion_tokens for t in turns)
    if draft_vocab is not None:
        counted = [t.token_ids for t in turns if t.token_ids is not None]
        if counted:
            m.counted_tokens = sum(len(ids) for ids in counted)
            m.in_draft_vocab = sum(1 for ids in counted for i in ids if i in draft_vocab)
    if speculative:
        if client.engine == "vllm":
            m.counters = client.counters() - before
            m.acceptance = acceptance_from_counters(m.counters, k)
            m.engine_figure = m.acceptance.mean_acceptance_length
        else:
            m.metas = [t.meta_info or {} for t in turns]
            m.acceptance = acceptance_from_meta_infos(m.metas, k)
            m.engine_figure = client.counters().accept_length
    log.info(
        "%s/%s: %d prompts, %d turns, %d output tokens in %.1f s (%.1f tok/s)%s", client.engine, eval_set.name,
        m.requests, m.turns, m.output_tokens, m.wall_s, m.output_tokens_per_s or 0.0,
        f", acceptance rate {m.acceptance.acceptance_rate}, length {m.acceptance.mean_acceptance_length}"
        if m.acceptance else "",
    )
    return m


def overall(measures: list[SetMeasure], engine: str, k: int) -> SetMeasure:
    """All sets together: sums of counters (vLLM) or of per-request counts (SGLang), then the formulas once."""
    o = SetMeasure(name="overall", requests=sum(m.requests for m in measures), turns=sum(m.turns for m in measures),
                   output_tokens=sum(m.output_tokens for m in measures), wall_s=sum(m.wall_s for m in measures))
    known = [m for m in measures if m.in_draft_vocab is not None]
    if known:
        o.in_draft_vocab = sum(m.in_draft_vocab for m in known)
        o.counted_tokens = sum(m.counted_tokens for m in known)
    if measures and all(m.acceptance is not None for m in measures):
        if engine == "vllm":
            acc = measures[0].counters
            for m in measures[1:]:
                acc = _add(acc, m.counters)
            o.counters = acc
            o.acceptance = acceptance_from_counters(acc, k)
        else:
            o.metas = [x for m in measures for x in m.metas]
            o.acceptance = acceptance_from_meta_infos(o.metas, k)
    return o


def _add(a: SpecCounters, b: SpecCounters) -> SpecCounters:
    n = max(len(a.per_pos), len(b.per_pos))
    pa = a.per_pos + (0.0,) * (n - len(a.per_pos))
    pb = b.per_pos + (0.0,) * (n - len(b.per_pos))
    return SpecCounters(a.drafts + b.drafts, a.draft_tokens + b.draft_tokens, a.accepted + b.accepted,
                        tuple(x + y for x, y in zip(pa, pb, strict=True)),
                        a.generation_tokens + b.generation_tokens, a.has_spec and b.has_spec)
