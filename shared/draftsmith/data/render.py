"""Rendering records with the target tokenizer's own chat template, and finding the target-generated spans.

Rule (docs/data.md): for assistant turn k at message index a_k,

- ``P_k`` = template(messages[:a_k], add_generation_prompt=True): the prompt the server tokenized;
- ``F_k`` = template(messages[:a_k + 1]): the same conversation with turn k rendered as the last message;
- ``F_k`` must start with ``P_k`` as text; the turn's text is the rest, ``F_k[len(P_k):]``, and its tokens end
  at the last end-of-turn token (the template's trailing tokens after it, e.g. ChatML's ``\\n``, are context, not
  generated). A turn cut by ``finish_reason == "length"`` never generated its end-of-turn token, so the span
  stops before it.

Texts are tokenized the way vLLM does it: render to text, then ``tokenizer(text, add_special_tokens=False)``; the
prompt ``P_k`` and the turn's text are tokenized separately, as the server saw them (prompt ids, then generated
ids), so no merge across the boundary can shift the span.
Turns are merged into one sample while each next prompt extends the previous sequence token for token; templates
that drop earlier reasoning from the history (Qwen3, DeepSeek, Kimi-K2, gpt-oss) break that, and the next turn then
starts a new sample, so every sample is a sequence the target really saw. The prefix-diff idea follows SpecForge's
and TRL's assistant-mask builders; the code is draftsmith's own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.data.records import RecordNotes
from draftsmith.errors import DataError, ModelError
from draftsmith.log import get_logger

log = get_logger(__name__)

PROBE = "draftsmith-probe-reasoning-7f3a"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _unmarked(text: str) -> str:
    """``text`` without its ``<think>`` / ``</think>`` markers (what a reasoning parser may consume of them)."""
    return text.replace(THINK_OPEN, "").replace(THINK_CLOSE, "")


class SampleSkip(Exception):
    """A record that cannot become a sample; ``reason`` is counted in stats.json, ``detail`` is logged."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass
class TurnSpan:
    """Where assistant turn ``turn`` of a record lies in a sample.

    Attributes:
        turn: index of the assistant turn in the record (0-based, same order as ``record["turns"]``).
        start, end: token positions ``[start, end)`` of the generated span in the sample's ``input_ids``.
        expected: the ids the server reported it generated (``turns[turn].token_ids``), or None.
    """

    turn: int
    start: int
    end: int
    expected: list[int] | None = None
    prompt: list[int] | None = None  # the rendered prompt ids P_k, when the server reported its own
    prompt_expected: list[int] | None = None  # ``turns[turn].prompt_token_ids``: the prompt the server saw


@dataclass
class Sample:
    """One training sequence: ``input_ids`` ``[T]`` and ``loss_mask`` ``[T]`` (1 = target-generated token)."""

    record_id: str
    input_ids: list[int]
    loss_mask: list[int]
    spans: list[TurnSpan] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def load_tokenizer(path: str | Path, chat_template: str | Path | None = None, trust_remote_code: bool = False):
    """Load the target tokenizer from a local folder, optionally replacing its chat template.

    Args:
        path: checkpoint or tokenizer folder (``tokenizer.json``, or a tokenizer class of the checkpoint's own named
            in ``tokenizer_config.json``'s ``auto_map``, such as Kimi-K2's tiktoken one over ``tiktoken.model``).
        chat_template: a Jinja file that overrides the folder's template (for templates that drop reasoning).
        trust_remote_code: ``target.trust_remote_code``: run the tokenizer code the folder ships.

    Raises:
        DataError: the folder is missing, transformers cannot load it, or the tokenizer has no chat template.
        ModelError: the tokenizer is the checkpoint's own code and ``trust_remote_code`` is off.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise DataError(f"tokenizer folder {path} does not exist", "set data.tokenizer or target.path")
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if not trust_remote_code and "trust_remote_code" in str(e):
            raise remote_code_error(path, "tokenizer") from e
        raise DataError(f"transformers cannot load the tokenizer at {path}: {e}",
                        "point data.tokenizer or target.path at the target's checkpoint folder") from e
    except OSError as e:
        raise DataError(f"transformers cannot load the tokenizer at {path}: {e}",
                        "point data.tokenizer or target.path at the target's checkpoint folder") from e
    if chat_template is not None:
        tok.chat_template = Path(chat_template).read_text()
    if not getattr(tok, "chat_template", None):
        raise DataError(
            f"the tokenizer at {path} has no chat template",
            "use the target's own checkpoint folder, or pass a template file with data.chat_template",
        )
    return tok


# Vocabulary files of tokenizers without a tokenizer.json (tiktoken, sentencepiece, BPE pairs) and the code of a
# checkpoint's own tokenizer class: what a hash of the tokenizer covers when tokenizer.json is absent.
TOKENIZER_FILES = ("tiktoken.model", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")


def tokenizer_files(path: str | Path) -> list[Path]:
    """The files that define the tokenizer of folder ``path``: ``tokenizer.json`` when present (a fast tokenizer
    is whole in it), else :data:`TOKENIZER_FILES` and ``tokenization_*.py`` that exist, sorted by name."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return [path / "tokenizer.json"]
    return sorted([path / n for n in TOKENIZER_FILES if (path / n).is_file()] + list(path.glob("tokenization_*.py")))


def tokenizer_sha256(tok, path: str | Path) -> str:
    """sha256 of the tokenizer's files (:func:`tokenizer_files`) and the chat template in use: what rendering
    depends on."""
    h = hashlib.sha256()
    for f in tokenizer_files(path):
        h.update(f.read_bytes())
    h.update((tok.chat_template or "").encode())
    return h.hexdigest()


def remote_code_error(path: str | Path, what: str) -> ModelError:
    """The one error for a checkpoint whose ``what`` (tokenizer, config, model) is its own Python code while
    ``target.trust_remote_code`` is off."""
    return ModelError(f"the {what} of {path} is the checkpoint's own Python code (auto_map), which draftsmith "
                      "runs only when told to", "read the checkpoint's *.py files, then set "
                      "target.trust_remote_code=true (DRAFTSMITH_TARGET__TRUST_REMOTE_CODE=true)")


def end_of_turn_ids(tok, path: str | Path | None = None) -> set[int]:
    """Token ids that end a generated turn: the tokenizer's eos plus ``generation_config.json``'s eos ids."""
    import json

    ids: set[int] = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    gc = Path(path) / "generation_config.json" if path is not None else None
    if gc is not None and gc.is_file():
        eos = json.loads(gc.read_text()).get("eos_token_id")
        ids.update(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
    return ids


class ChatRenderer:
    """Turns records into :class:`Sample` objects with the tokenizer's own chat template.

    Args:
        tok: a transformers tokenizer with a chat template.
        eot_ids: end-of-turn token ids (see :func:`end_of_turn_ids`).
        template_kwargs: extra template variables (``enable_thinking``...); when absent, ``enable_thinking`` and
            ``thinking`` are set per turn to whether that turn has reasoning.

    Attributes:
        reasoning_mode: how reasoning reaches the template, found by probing it once: ``field`` (the template reads
            ``reasoning_content`` / ``reasoning`` / ``thinking``), ``markers`` (``<think>``...``</think>`` in the
            content, which the template parses) or ``none`` (records with reasoning are skipped as
            ``template_drops_reasoning``).
    """

    def __init__(self, tok, eot_ids: set[int], template_kwargs: dict[str, Any] | None = None) -> None:
        self.tok = tok
        self.eot_ids = set(eot_ids)
        self.template_kwargs = dict(template_kwargs or {})
        vocab = tok.get_vocab()
        self._has_think = THINK_OPEN in vocab and THINK_CLOSE in vocab
        self.reasoning_mode = self._probe()
        log.info("chat template reasoning mode: %s; end-of-turn ids %s", self.reasoning_mode, sorted(self.eot_ids))

    # ---- template access -------------------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], gen_prompt: bool, thinking: bool) -> str:
        kw = dict(self.template_kwargs)
        kw.setdefault("enable_thinking", thinking)
        kw.setdefault("thinking", thinking)
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen_prompt, **kw)
        except Exception as e:  # jinja raise_exception or a template bug: the record is skipped and counted
            raise SampleSkip("template_error", str(e)[:200]) from e

    def _message(self, m: dict[str, Any], mode: str) -> dict[str, Any]:
        out = {"role": m["role"], "content": m.get("content") or ""}
        r = m.get("reasoning") or m.get("reasoning_content")
        if m["role"] == "assistant" and r:
            if mode == "field":
                out.update(reasoning_content=r, reasoning=r, thinking=r)
            elif mode == "markers":
                out["content"] = f"{THINK_OPEN}\n{r}\n{THINK_CLOSE}\n\n{out['content']}"
        return out

    def _probe(self) -> str:
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": PROBE}]
        vocab = self.tok.get_vocab()
        modes = ["field"] + (["markers"] if THINK_OPEN in vocab and THINK_CLOSE in vocab else [])
        for mode in modes:
            try:
                text = self._render([self._message(m, mode) for m in msgs], False, True)
            except SampleSkip:
                continue
            if PROBE in text:
                return mode
        return "none"

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of rendered texts, as vLLM tokenizes a chat prompt (no extra special tokens).

        Uses the Rust backend (``backend_tokenizer.encode_batch``) directly when there is one: the same ids as
        ``tokenizer(texts, add_special_tokens=False)`` without building a ``BatchEncoding``.
        """
        if not texts:
            return []
        backend = getattr(self.tok, "backend_tokenizer", None)
        if backend is not None:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    # ---- one record --------------------------------------------------------------------------------------------
    def split_inline_reasoning(self, rec: dict[str, Any]) -> int:
        """Move reasoning that a server without a reasoning parser left in ``content`` into ``reasoning``.

        Such a server returns the raw generation: ``<think>R</think>A`` (Qwen3, Kimi), or ``R</think>A`` when the
        generation prompt opened the block itself (DeepSeek-R1/V3.1), or ``<think>R`` cut by ``max_tokens``. The
        template then rendered the turn *with* thinking (the server's default), so the record is rendered the same
        way: reasoning ``R`` and answer ``A``. Only for templates with a place for reasoning and a tokenizer that
        has both think tokens; the record is changed in place.

        Returns:
            The number of assistant turns split.
        """
        if self.reasoning_mode == "none" or not self._has_think:
            return 0
        n = 0
        for m in rec["messages"]:
            c = m.get("content")
            if m.get("role") != "assistant" or not isinstance(c, str) or m.get("reasoning") or m.get(
                    "reasoning_content"):
                continue
            head = c.lstrip()
            if THINK_CLOSE in c:
                r, _, a = c.partition(THINK_CLOSE)
                r = r.lstrip()
                r = r[len(THINK_OPEN):] if r.startswith(THINK_OPEN) else r
            elif head.startswith(THINK_OPEN):  # cut before </think>: all of it is reasoning
                r, a = head[len(THINK_OPEN):], ""
            else:
                continue
            m["reasoning"], m["content"] = r.strip("\n") or None, a.lstrip("\n")
            n += 1
        return n

    def reparse_from_ids(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        """A copy of ``rec`` whose assistant turns are read again from the ids the server generated, where the
        server's reasoning parser dropped think markers and nothing else; None otherwise.

        vLLM's ``kimi_k2`` parser consumes a ``</think>`` that the target generates after its reasoning already
        ended, so the answer's text lacks a token the target generated and no rendering of the record is
        token-exact. Decoding the generated ids (special tokens kept, the end-of-turn tokens left out) gives the raw
        generation, which :meth:`texts` then splits at its first ``</think>`` as for a server without a reasoning
        parser (:meth:`split_inline_reasoning`). Only when, for every assistant turn, the raw generation without
        its ``<think>``/``</think>`` markers is exactly the record's reasoning followed by its answer, also without
        them (the parser keeps a second ``<think>`` that a target opened inside its answer but consumes the
        ``</think>`` after it): a record whose text differs in anything else (reasoning glued to the answer by
        hand, a changed answer) stays a mismatch.
        """
        if self.reasoning_mode == "none" or not self._has_think:
            return None
        assistants = [i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant"]
        turns = rec["turns"]
        if len(turns) != len(assistants) or any(not t.get("token_ids") for t in turns):
            return None
        new = {**rec, "messages": [dict(m) for m in rec["messages"]]}
        for i, turn in zip(assistants, turns, strict=True):
            ids = list(turn["token_ids"])
            while ids and ids[-1] in self.eot_ids:
                ids.pop()
            raw = self.tok.decode(ids, skip_special_tokens=False)
            m = new["messages"][i]
            parsed = (m.get("reasoning") or m.get("reasoning_content") or "") + (m.get("content") or "")
            if _unmarked(raw) != _unmarked(parsed):
                return None
            for key in ("reasoning", "reasoning_content", "thinking"):
                m.pop(key, None)
            m["content"] = raw
        return new

    def texts(self, rec: dict[str, Any], notes: RecordNotes | None = None) -> list[tuple[str, str]]:
        """``[(P_k, F_k[len(P_k):])]``: prompt text and turn text of every assistant turn k (see the module doc).

        Reasoning left inline in the content is split out first (:meth:`split_inline_reasoning`; ``notes`` gets the
        flag ``inline_reasoning``).

        Raises:
            SampleSkip: ``template_drops_reasoning`` (a turn's reasoning is not in the rendering),
                ``template_not_prefix_stable`` (``F_k`` does not start with ``P_k``) or ``template_error``.
        """
        if self.split_inline_reasoning(rec) and notes is not None:
            notes.flags.append("inline_reasoning")
        msgs = rec["messages"]
        out = []
        for k, a in enumerate(i for i, m in enumerate(msgs) if m["role"] == "assistant"):
            r = msgs[a].get("reasoning") or msgs[a].get("reasoning_content")
            if r and self.reasoning_mode == "none":
                raise SampleSkip("template_drops_reasoning", f"turn {k}: the chat template has no place for it")
            conv = [self._message(m, self.reasoning_mode) for m in msgs[: a + 1]]
            p = self._render(conv[:a], True, bool(r))
            f = self._render(conv, False, bool(r))
            if not f.startswith(p):
                raise SampleSkip("template_not_prefix_stable", f"turn {k}: rendering with the turn does not extend "
                                 "the generation prompt")
            if r and r.strip() not in f[len(p):]:
                raise SampleSkip("template_drops_reasoning", f"turn {k}: reasoning missing from the rendering")
            out.append((p, f[len(p):]))
        return out

    def assemble(self, rec: dict[str, Any], ids: list[tuple[list[int], list[int]]],
                 notes: RecordNotes | None = None) -> list[Sample]:
        """Build the samples of a record from the token ids of its ``(prompt, turn)`` texts (see :meth:`texts`).

        A turn cut inside its reasoning supervises exactly its generated ids and ends its sample; without ids it is
        left out, listed in ``notes.dropped_turns`` (``truncated_reasoning``). Where the server reported
        ``prompt_token_ids``, the prompt of the same text takes those ids, and a prompt of another text is kept
        on the span for :func:`draftsmith.data.validate.validate_sample` to report.

        Returns:
            One sample per run of prefix-consistent turns (usually one per record).
        """
        samples: list[Sample] = []
        cur: Sample | None = None
        dropped_turns = notes.dropped_turns if notes is not None else []
        assistants = [m for m in rec["messages"] if m["role"] == "assistant"]
        for k, (p, tail) in enumerate(ids):                     # p: [n_prompt], tail: [n_turn] incl. template tail
            turn = rec["turns"][k]
            expected = turn.get("token_ids")
            flags: list[str] = []
            p_exp = turn.get("prompt_token_ids")
            p_rendered = None
            if p_exp is not None and list(p_exp) != p:
                p_rendered = p
                if self.same_text(p, p_exp, {}):
                    p, p_rendered = list(p_exp), None           # same prompt text, the server's own ids
                    flags.append("prompt_retokenized")
            cut = self.cut_reasoning(turn, assistants[k])
            if cut and expected is None:
                # cut by max_tokens inside the reasoning: the template closes a block the target never closed, and
                # without the server's ids what was generated is unknown: the turn is not supervised
                dropped_turns.append("truncated_reasoning")
                if cur is not None:
                    samples.append(cur)
                cur = None
                continue
            if cut and self.is_prefix(expected, tail):
                tail, end = list(expected), len(expected)      # exactly what was generated, nothing after it
                flags.append("cut_reasoning")
            else:  # (a cut turn whose text differs from its ids stays a mismatch for validation to report)
                eots = [j for j, t in enumerate(tail) if t in self.eot_ids]
                end = eots[-1] + 1 if eots else len(tail)       # generated span: tail[:end]
                if turn.get("finish_reason") == "length" and eots:
                    end -= 1                                    # the end-of-turn token was never generated
            retokenized = False
            if expected is not None and tail[:end] != list(expected) and self.same_text(tail[:end], expected, turn):
                # The target generated a non-canonical tokenization of the very same text (BPE merges differ
                # from what re-tokenizing gives, or a cut multi-byte character at a length stop): supervise the
                # ids it really generated. A different *text* stays a mismatch for validation to report.
                tail = list(expected) + tail[end:]
                end = len(expected)
                retokenized = True
            if cur is None or p[: len(cur.input_ids)] != cur.input_ids:
                if cur is not None:
                    samples.append(cur)
                cur = Sample(rec["id"], [], [])
            new_ctx = p[len(cur.input_ids):]
            start = len(p)
            cur.input_ids += new_ctx + tail
            cur.loss_mask += [0] * len(new_ctx) + [1] * end + [0] * (len(tail) - end)
            cur.spans.append(TurnSpan(k, start, start + end, turn.get("token_ids"),
                                      p_rendered, None if p_rendered is None else list(p_exp)))
            cur.flags += flags + (["retokenized"] if retokenized else [])
            msg_r = assistants[k]
            if (turn.get("reasoning_field") or self.reasoning_mode != "none") and not (
                msg_r.get("reasoning") or msg_r.get("reasoning_content")
            ):
                cur.flags.append("empty_reasoning")
            if "cut_reasoning" in flags:                        # nothing the target saw follows a cut turn
                samples.append(cur)
                cur = None
        if cur is not None:
            samples.append(cur)
        return samples

    def cut_reasoning(self, turn: dict[str, Any], msg: dict[str, Any]) -> bool:
        """True for a turn cut by ``max_tokens`` inside its reasoning: ``finish_reason == "length"``, reasoning but
        no answer (the reasoning parser found no end of the block)."""
        return (turn.get("finish_reason") == "length" and not (msg.get("content") or "").strip()
                and bool(msg.get("reasoning") or msg.get("reasoning_content")) and self.reasoning_mode != "none")

    def is_prefix(self, generated: list[int], tail: list[int]) -> bool:
        """True when the rendered turn text starts with the generated text (whitespace and a cut character at
        its end aside): the record's reasoning is the one these ids produced, before the template closed it."""
        g = self.tok.decode(list(generated), skip_special_tokens=False).rstrip().rstrip("\ufffd")
        return self.tok.decode(tail, skip_special_tokens=False).startswith(g)

    def same_text(self, rendered: list[int], generated: list[int], turn: dict[str, Any]) -> bool:
        """True when two id sequences decode to the same text (special tokens kept); at a length stop a trailing
        incomplete character (U+FFFD) is ignored, since the server holds back bytes of a cut character."""
        a = self.tok.decode(rendered, skip_special_tokens=False)
        b = self.tok.decode(list(generated), skip_special_tokens=False)
        if turn.get("finish_reason") == "length":
            a, b = a.rstrip("\ufffd"), b.rstrip("\ufffd")
        return a == b

    def render(self, rec: dict[str, Any]) -> list[Sample]:
        """Texts, token ids and samples of one record (see :meth:`texts` and :meth:`assemble`); the record's own
        flags (``inline_reasoning``) are added to each sample's."""
        notes = RecordNotes(where=str(rec.get("id")))
        samples = self.render_notes(rec, notes)
        for s in samples:
            s.flags += notes.flags
        return samples

    def render_notes(self, rec: dict[str, Any], notes: RecordNotes) -> list[Sample]:
        """:meth:`render` with the record's flags and left-out turns written to ``notes`` instead."""
        pairs = self.texts(rec, notes)
        flat = self.encode([t for pf in pairs for t in pf])
        return self.assemble(rec, [(flat[2 * i], flat[2 * i + 1]) for i in range(len(pairs))], notes)
