"""Defaults the target's own files decide, for the keys the config leaves unset.

- Sampling: ``temperature``, ``top_p`` and ``top_k`` of the checkpoint's ``generation_config.json``, the values its
  authors recommend. vLLM (``--generation-config auto``, its default) and SGLang apply the same file to a request that
  names no sampling; draftsmith always names its sampling (it is stored in every record), so it reads the file
  itself. A long-reasoning target under greedy decoding repeats itself until ``max_tokens``; its recommended
  sampling does not.
- Cut answers of a reasoning target: ``data.truncated_answers=drop``. A reasoning target is one whose profile names a
  reasoning parser (:mod:`draftsmith.target.profile`) or whose chat template writes ``<think>``; a turn cut inside
  its reasoning would teach the drafter a conversation that never ends.
- The request timeout: ``generation.request_timeout_s`` from ``max_tokens`` at ``generation.decode_tok_s``, with
  a margin (:func:`derived_request_timeout_s`); no target file is needed.

Each value taken is returned as one line naming the key, the value and where it came from, for the log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsmith.artifacts.data import STATS_FILE
from draftsmith.errors import ModelError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import target_checkpoint, target_config_path
from draftsmith.target.profile import target_profile

if TYPE_CHECKING:
    from draftsmith.config import Settings

log = get_logger(__name__)

GENERATION_CONFIG = "generation_config.json"
SAMPLING_KEYS = ("temperature", "top_p", "top_k")
THINK_MARKER = "<think>"  # Qwen3, DeepSeek-R1/V3.1, Kimi-K2-Thinking and Kimi-K2.5 templates all write it
TIMEOUT_FLOOR_S = 3600.0  # the timeout of short answers: a queue wait at full concurrency fits in it
TIMEOUT_MARGIN = 2.0  # over max_tokens at the assumed slowest rate
JOB_TIMEOUT_FLOOR_S = 6 * 3600  # a generation job's rq timeout at least (its batch of short answers fits in it)
JOB_TIMEOUT_MARGIN_S = 600.0  # over one request's retries: the job's own work (records, shard writes)


def recommended_sampling(folder: Path | str) -> dict[str, float | int]:
    """The sampling keys (:data:`SAMPLING_KEYS`) that ``<folder>/generation_config.json`` sets; {} without the file.

    ``do_sample`` is not read: vLLM takes these values from the file whatever it says, and so does this.

    Raises:
        ModelError: the file is not JSON.
    """
    path = Path(folder) / GENERATION_CONFIG
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path}: {e}", "the checkpoint folder is damaged; download it again") from e
    out: dict[str, float | int] = {}
    for k in SAMPLING_KEYS:
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = int(v) if k == "top_k" else float(v)
    return out


def _chat_template(folder: Path) -> str:
    """The chat template of a checkpoint folder: ``chat_template.jinja``, else ``tokenizer_config.json``'s."""
    f = folder / "chat_template.jinja"
    if f.is_file():
        return f.read_text(errors="replace")
    try:
        tmpl = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return ""
    if isinstance(tmpl, list):  # named templates: [{"name": ..., "template": ...}]
        return "\n".join(str(t.get("template", "")) for t in tmpl if isinstance(t, dict))
    return str(tmpl or "")


def reasoning_evidence(folder: Path | str) -> str | None:
    """Why the target of ``folder`` is a reasoning one (its profile's reasoning parser, or ``<think>`` in its chat
    template), or None when nothing says so."""
    folder = Path(folder)
    # a tokenizer-only folder has no config.json to profile; its chat template still tells
    prof = target_profile(folder) if target_config_path(folder).is_file() else None
    if prof is not None and prof.reasoning_parser:
        return f"its profile ({prof.family}) names the reasoning parser {prof.reasoning_parser}"
    if THINK_MARKER in _chat_template(folder):
        return f"its chat template writes {THINK_MARKER}"
    return None


def derived_request_timeout_s(max_tokens: int, decode_tok_s: float) -> float:
    """Seconds one request may take: ``max_tokens`` at ``decode_tok_s`` tokens/s times :data:`TIMEOUT_MARGIN`,
    never under :data:`TIMEOUT_FLOOR_S` (32,768 tokens at 10 tok/s: 6,554 s)."""
    return max(TIMEOUT_FLOOR_S, TIMEOUT_MARGIN * max_tokens / decode_tok_s)


def retry_budget_s(g: Any) -> float:
    """Seconds every attempt of one request may take: ``max_retries + 1`` attempts of the request timeout
    (``g.request_timeout_s``, else :func:`derived_request_timeout_s`) plus the back-off between them at its longest
    (``backoff_s`` doubling per retry, with +50 % jitter: the client's, :class:`draftsmith.generation.client.ChatClient`).

    Args:
        g: a :class:`draftsmith.config.GenerationConfig`.
    """
    request_s = g.request_timeout_s or derived_request_timeout_s(g.max_tokens, g.decode_tok_s)
    backoff = sum(1.5 * g.backoff_s * 2**i for i in range(g.max_retries))
    return (g.max_retries + 1) * request_s + backoff


def generation_job_timeout_s(g: Any) -> int:
    """The rq timeout of a generation job, in seconds: ``g.job_timeout_s`` when set, else the retries of one
    request (:func:`retry_budget_s`) and a :data:`JOB_TIMEOUT_MARGIN_S` for the job's own work, never under
    :data:`JOB_TIMEOUT_FLOOR_S` (6 h). Derived, a job is never killed while a request is still being retried:
    32,768-token answers at 10 tok/s take 6 attempts of 6,554 s and their back-off, 39,368 s; the job gets 39,968 s."""
    if g.job_timeout_s is not None:
        return int(g.job_timeout_s)
    return int(max(JOB_TIMEOUT_FLOOR_S, retry_budget_s(g) + JOB_TIMEOUT_MARGIN_S))


def job_timeout_warning(g: Any) -> str | None:
    """One line when a set ``g.job_timeout_s`` is shorter than one request's retries (:func:`retry_budget_s`): rq
    would kill the job while a request is still being retried (its finished answers are kept, the rest run again).
    None when it covers them or is derived."""
    budget = retry_budget_s(g)
    if g.job_timeout_s is None or g.job_timeout_s >= budget:
        return None
    request_s = g.request_timeout_s or derived_request_timeout_s(g.max_tokens, g.decode_tok_s)
    return (f"generation.job_timeout_s={g.job_timeout_s} s is shorter than the retries of one request "
            f"({g.max_retries + 1} attempts of {request_s:,.0f} s and their back-off: {budget:,.0f} s): rq kills "
            "a job whose request is still retried; leave it unset to derive it")


def apply_generation_defaults(s: Settings, folder: Path | str | None) -> list[str]:
    """Fill the generation keys ``s`` leaves unset: sampling from the target's ``generation_config.json`` (when
    ``folder`` is given and has one), ``request_timeout_s`` from the lengths. ``s`` is changed in place.

    Returns:
        One line per value taken: ``generation.temperature=0.6 (from <folder>/generation_config.json)``.
    """
    g = s.generation
    lines: list[str] = []
    if folder is not None:
        given = g.model_fields_set
        for k, v in recommended_sampling(folder).items():
            if k not in given:
                setattr(g, k, v)
                lines.append(f"generation.{k}={v} (from {Path(folder) / GENERATION_CONFIG})")
    if g.request_timeout_s is None:
        g.request_timeout_s = derived_request_timeout_s(g.max_tokens, g.decode_tok_s)
        lines.append(f"generation.request_timeout_s={g.request_timeout_s:.0f} (derived: max_tokens {g.max_tokens} "
                     f"at generation.decode_tok_s {g.decode_tok_s:g} tok/s, x{TIMEOUT_MARGIN:g}, at least "
                     f"{TIMEOUT_FLOOR_S:.0f} s)")
    for line in lines:
        log.debug("default %s", line)  # the callers print each line (enqueue, build-data)
    return lines


def apply_data_defaults(s: Settings, folder: Path | str) -> list[str]:
    """Fill the data keys ``s`` leaves unset from the target at ``folder``: ``truncated_answers=drop`` for a
    reasoning target. ``s`` is changed in place; returns one line per value taken, as
    :func:`apply_generation_defaults`."""
    lines: list[str] = []
    if "truncated_answers" not in s.data.model_fields_set:
        why = reasoning_evidence(folder)
        if why:
            s.data.truncated_answers = "drop"
            lines.append(f"data.truncated_answers=drop (a reasoning target: {why}; cut answers are dropped and "
                         f"counted in {STATS_FILE} dropped_by_reason)")
    for line in lines:
        log.debug("default %s", line)  # the callers print each line (enqueue, build-data)
    return lines


def target_folder_or_none(s: Settings) -> Path | None:
    """The target checkpoint folder of ``s`` when it can be read here (``target.path``, or the prepared embedded
    default), else None: a generator host without the checkpoint keeps the config's own sampling."""
    try:
        return target_checkpoint(s)
    except ModelError as e:
        log.warning("target defaults not read: %s", e)
        return None

