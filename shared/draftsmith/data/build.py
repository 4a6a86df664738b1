"""``build-data``: records -> packed training samples, stats and the draft vocabulary (docs/formats.md §3).

Every record ends as samples or as a counted drop with its reason; the build fails (DataError) when the share of
turns that are not token-exact exceeds ``data.max_mismatch_rate`` or the share of dropped records exceeds
``data.max_drop_rate``. A failed build writes ``stats.json`` (with ``"failed"``) but no manifest, so later stages
cannot pick up half-right data.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from draftsmith.artifacts import data as artifact
from draftsmith.artifacts.data import DATA_SCHEMA
from draftsmith.artifacts.storage import atomic_write_bytes
from draftsmith.config import DataConfig
from draftsmith.data.records import RecordNotes, Skip, iter_records, record_files
from draftsmith.data.render import (
    ChatRenderer,
    Sample,
    SampleSkip,
    end_of_turn_ids,
    load_tokenizer,
    tokenizer_sha256,
)
from draftsmith.data.validate import Mismatch, validate_sample
from draftsmith.data.vocab import count_tokens, data_hash, save_counts, write_draft_vocab
from draftsmith.errors import DataError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import read_target_config, target_config_path

log = get_logger(__name__)

CHUNK = 256  # records rendered and tokenized per batch
MAX_REPORTED_MISMATCHES = 50
# the drop reason of a captured prompt the gateway kept without the target's answer (serving/capture.py)
UNANSWERED = "record_error:unanswered"


@dataclass
class BuildResult:
    """What a build (or a ``--check``) found: stats as written to stats.json, the mismatches, the manifest."""

    stats: dict[str, Any]
    mismatches: list[Mismatch] = field(default_factory=list)
    manifest: dict[str, Any] | None = None


def _histogram(lengths: list[int]) -> dict[str, int]:
    """Sample lengths in power-of-two buckets: ``{"<=64": n, "<=128": n, ...}``."""
    hist: Counter[str] = Counter()
    for n in lengths:
        edge = 64
        while edge < n:
            edge *= 2
        hist[f"<={edge}"] += 1
    return dict(sorted(hist.items(), key=lambda kv: int(kv[0][2:])))


class _ShardWriter:
    """Packs samples into ``samples-XXXXX.safetensors`` (input_ids int32, loss_mask uint8, offsets int64)."""

    def __init__(self, out_dir: Path, per_shard: int, enabled: bool) -> None:
        self.out_dir, self.per_shard, self.enabled = out_dir, per_shard, enabled
        self.buf: list[tuple[str, Sample]] = []
        self.shards: list[dict[str, Any]] = []
        self.counts = None  # int64 [V] supervised-token frequencies, summed over shards

    def add(self, sid: str, s: Sample, vocab_size: int) -> None:
        self.buf.append((sid, s))
        if len(self.buf) >= self.per_shard:
            self.flush(vocab_size)

    def flush(self, vocab_size: int) -> None:
        import numpy as np
        import torch
        from safetensors.torch import save

        if not self.buf:
            return
        lengths = [len(s.input_ids) for _, s in self.buf]
        total = sum(lengths)
        ids = torch.from_numpy(np.fromiter(chain.from_iterable(s.input_ids for _, s in self.buf), np.int32, total))
        mask = torch.from_numpy(np.fromiter(chain.from_iterable(s.loss_mask for _, s in self.buf), np.uint8, total))
        # ids, mask: [T_total]
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)  # [S+1]
        offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        c = count_tokens(ids, mask, vocab_size)
        self.counts = c if self.counts is None else self.counts + c
        name = artifact.shard_file(len(self.shards))
        blob = save({"input_ids": ids, "loss_mask": mask, "offsets": offsets}, {"schema": DATA_SCHEMA})
        if self.enabled:
            atomic_write_bytes(self.out_dir / name, blob)
        self.shards.append({"file": name, "sample_ids": [sid for sid, _ in self.buf], "lengths": lengths,
                            "sha256": hashlib.sha256(blob).hexdigest()})
        self.buf = []


def unclosed_reasoning(rec: dict[str, Any]) -> bool:
    """True when an assistant turn of ``rec`` is reasoning only: the target ended inside its thinking.

    A reasoning parser (vLLM's ``deepseek_r1``) returns a whole output that never reached the end-of-reasoning marker
    (``</think>``) as reasoning with no content. The chat template renders that marker after the reasoning anyway, so
    such a turn can never be token-exact; like a turn cut at ``max_tokens`` it is dropped under
    ``data.truncated_answers: drop`` (counted as ``unclosed_reasoning``).
    """
    return any(m.get("role") == "assistant" and (m.get("reasoning") or m.get("reasoning_content"))
               and not m.get("content") for m in rec.get("messages", []))


def target_vocab_size(tok, tokenizer_path: Path) -> int:
    """V: the larger of ``len(tokenizer)`` and ``config.json``'s ``vocab_size`` (embedding rows of the target; a
    multimodal wrapper such as Kimi-K2.5 keeps it under ``text_config``)."""
    v = len(tok)
    if target_config_path(tokenizer_path).is_file():
        c = read_target_config(tokenizer_path)
        v = max(v, int(c.get("vocab_size") or (c.get("text_config") or {}).get("vocab_size") or 0))
    return v


@dataclass
class BuildStats:
    """The counters of one build, as ``stats.json`` reports them (:meth:`to_json`).

    Attributes:
        records: record lines read (usable or not). turns_checked / turns_mismatched: generated spans compared with
            the server's ids / not token-exact. prompts_checked / prompts_mismatched: the same for the prompts the
            server reported. truncations: samples cut to ``data.max_length``. tokens / supervised: tokens of the
            kept samples / of them under the loss mask.
        dropped: records dropped, by reason. dropped_turns: turns left out of records that still gave samples.
        flags: records carrying each flag. lengths: token length of every kept sample.
        mismatches: the first :data:`MAX_REPORTED_MISMATCHES` mismatches.
    """

    records: int = 0
    turns_checked: int = 0
    turns_mismatched: int = 0
    prompts_checked: int = 0
    prompts_mismatched: int = 0
    truncations: int = 0
    tokens: int = 0
    supervised: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_turns: Counter[str] = field(default_factory=Counter)
    flags: Counter[str] = field(default_factory=Counter)
    lengths: list[int] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def mismatch_rate(self) -> float:
        """Share of the compared spans and prompts that are not token-exact (0 when nothing was compared)."""
        checked = self.turns_checked + self.prompts_checked
        return (self.turns_mismatched + self.prompts_mismatched) / checked if checked else 0.0

    @property
    def drop_rate(self) -> float:
        """Share of the record lines dropped, captured prompts that were never answered left out of both counts:
        they wait for an answer, they are not records that went wrong (docs/serving.md, "Refresh")."""
        waiting = self.dropped.get(UNANSWERED, 0)
        records = self.records - waiting
        return (sum(self.dropped.values()) - waiting) / records if records > 0 else 0.0

    def failure(self, cfg: DataConfig, records_dir: Path) -> DataError | None:
        """Why this build must not be used (no record, mismatch or drop rate above its threshold), else None."""
        if self.records == 0:
            return DataError(f"the record shards in {records_dir} hold no record", "check the generation run")
        if self.mismatch_rate > cfg.max_mismatch_rate:
            return DataError(
                f"{self.turns_mismatched} of {self.turns_checked} turns are not token-exact"
                + (f", {self.prompts_mismatched} of {self.prompts_checked} prompts differ from the server's"
                   if self.prompts_checked else "")
                + f" (rate {self.mismatch_rate:.4f} > "
                f"data.max_mismatch_rate {cfg.max_mismatch_rate}); first: {self.mismatches[0].describe()}",
                "render reasoning with the target's template (see docs/data.md) or fix the records",
            )
        if self.drop_rate > cfg.max_drop_rate:
            waiting = self.dropped.get(UNANSWERED, 0)
            return DataError(
                f"{sum(self.dropped.values()) - waiting} of {self.records - waiting} records dropped (rate "
                f"{self.drop_rate:.4f} > data.max_drop_rate {cfg.max_drop_rate}"
                + (f"; {waiting} captured prompts without an answer not counted" if waiting else "")
                + f"): {dict(self.dropped)}",
                f"see {artifact.STATS_FILE} dropped_by_reason, fix the cause or raise data.max_drop_rate",
            )
        return None

    def to_json(self, reasoning_mode: str, seconds: float, load_seconds: float) -> dict[str, Any]:
        """``stats.json`` (docs/formats.md §3)."""
        return {
            "schema": artifact.STATS_SCHEMA,
            "records": self.records,
            "samples": len(self.lengths),
            "tokens": self.tokens,
            "supervised_tokens": self.supervised,
            "dropped": sum(self.dropped.values()),
            "dropped_by_reason": dict(sorted(self.dropped.items())),
            "dropped_turns_by_reason": dict(sorted(self.dropped_turns.items())),
            "drop_rate": round(self.drop_rate, 6),
            "truncations": self.truncations,
            "flagged": dict(sorted(self.flags.items())),
            "turns_checked": self.turns_checked,
            "turns_mismatched": self.turns_mismatched,
            "prompts_checked": self.prompts_checked,
            "prompts_mismatched": self.prompts_mismatched,
            "mismatch_rate": round(self.mismatch_rate, 6),
            "mismatches": [m.to_dict() for m in self.mismatches],
            "length_histogram": _histogram(self.lengths),
            "reasoning_mode": reasoning_mode,
            "seconds": round(seconds, 3),
            "load_seconds": round(load_seconds, 3),
        }


class _Builder:
    """The per-record steps of a build: check the model, drop cut answers, render, validate (reading a record's
    turns again from their ids when the server's parser dropped text), cut to length, pack."""

    def __init__(self, tok, renderer: ChatRenderer, vsize: int, cfg: DataConfig, writer: _ShardWriter,
                 expected_model: str | None) -> None:
        self.tok, self.renderer, self.vsize, self.cfg, self.writer = tok, renderer, vsize, cfg, writer
        self.expected_model = expected_model
        self.stats = BuildStats()

    def process(self, chunk: list[tuple[dict[str, Any], RecordNotes]]) -> None:
        """Render a chunk of records, tokenize their texts in one batch, then assemble and keep each record's
        samples."""
        planned: list[tuple[dict[str, Any], RecordNotes, list[tuple[str, str]]]] = []
        for rec, notes in chunk:
            reason = self._refused(rec, notes)
            if reason:
                self.stats.dropped[reason] += 1
                continue
            try:
                planned.append((rec, notes, self.renderer.texts(rec, notes)))
            except SampleSkip as e:
                log.debug("skip %s: %s", rec["id"], e)
                self.stats.dropped[e.reason] += 1
        flat = self.renderer.encode([t for _, _, pairs in planned for pf in pairs for t in pf])
        i = 0
        for rec, notes, pairs in planned:
            ids = [(flat[i + 2 * k], flat[i + 2 * k + 1]) for k in range(len(pairs))]
            i += 2 * len(pairs)
            try:
                self._emit(rec, notes, self.renderer.assemble(rec, ids, notes))
            except SampleSkip as e:
                self.stats.dropped[e.reason] += 1

    def _refused(self, rec: dict[str, Any], notes: RecordNotes) -> str | None:
        """The drop reason of a record refused before rendering (a cut answer under ``truncated_answers: drop``).

        Raises:
            DataError: the record was generated by another model than the tokenizer's.
        """
        cfg = self.cfg
        if self.expected_model and cfg.check_model and rec.get("model") != self.expected_model:
            raise DataError(
                f"record {rec['id']} ({notes.where}) was generated by {rec.get('model')!r}, but the tokenizer "
                f"is {self.expected_model!r}",
                "point data.tokenizer / target.path at that model's checkpoint, or set target.model to its name",
            )
        if cfg.truncated_answers == "drop" and any(t.get("finish_reason") == "length" for t in rec["turns"]):
            return "truncated_answer"
        if cfg.truncated_answers == "drop" and unclosed_reasoning(rec):
            return "unclosed_reasoning"
        return None

    def _validated(self, rec: dict[str, Any], notes: RecordNotes, samples: list[Sample]):
        """``(samples, mismatches)`` of a record; where only generated spans mismatch, the turns read again from
        their ids when that makes every sample token-exact (flag ``reparsed_from_ids``)."""
        bad = [mm for s in samples for mm in validate_sample(s, self.tok)]
        if bad and all(mm.side != "prompt" for mm in bad):
            again = self.renderer.reparse_from_ids(rec)
            if again is not None:
                again_notes = RecordNotes(notes.where, notes.partial)
                try:
                    samples2 = self.renderer.render_notes(again, again_notes)
                except SampleSkip:
                    samples2 = []
                if samples2 and not any(validate_sample(s, self.tok) for s in samples2):
                    notes.flags += [*again_notes.flags, "reparsed_from_ids"]
                    notes.dropped_turns[:] = again_notes.dropped_turns
                    return samples2, []
        return samples, bad

    def _emit(self, rec: dict[str, Any], notes: RecordNotes, samples: list[Sample]) -> None:
        """Validate a record's samples, count what it gives or why it is dropped, and pack what is kept."""
        st, cfg = self.stats, self.cfg
        samples, bad = self._validated(rec, notes, samples)
        st.turns_checked += sum(sp.expected is not None for s in samples for sp in s.spans)
        st.prompts_checked += sum(t.get("prompt_token_ids") is not None for t in rec["turns"])
        st.turns_mismatched += sum(mm.side != "prompt" for mm in bad)
        if bad:
            for mm in bad:
                log.warning("token mismatch: %s", mm.describe())
            st.mismatches.extend(bad[: max(0, MAX_REPORTED_MISMATCHES - len(st.mismatches))])
            st.prompts_mismatched += sum(mm.side == "prompt" for mm in bad)
            st.dropped["prompt_mismatch" if any(mm.side == "prompt" for mm in bad) else "token_mismatch"] += 1
            return
        if not samples:
            st.dropped[(notes.dropped_turns or ["no_supervised_tokens"])[0]] += 1
            return
        st.dropped_turns.update(notes.dropped_turns)
        if notes.partial:
            st.dropped_turns[f"record_error:{notes.partial}"] += 1
            st.flags["partial_record"] += 1
        st.flags.update({f for s in samples for f in s.flags} | set(notes.flags))
        if cfg.require_reasoning and any("empty_reasoning" in s.flags for s in samples):
            st.dropped["empty_reasoning"] += 1
            return
        kept = [s for s in (self._fit(s) for s in samples) if s is not None]
        for j, s in enumerate(kept):
            self.writer.add(rec["id"] if len(kept) == 1 else f"{rec['id']}#{j}", s, self.vsize)
            st.lengths.append(len(s.input_ids))
            st.tokens += len(s.input_ids)
            st.supervised += sum(s.loss_mask)

    def _fit(self, s: Sample) -> Sample | None:
        """The sample cut to ``data.max_length`` (or None, dropped, under ``too_long: drop``); None when nothing
        of it is supervised."""
        if len(s.input_ids) > self.cfg.max_length:
            if self.cfg.too_long == "drop":
                self.stats.dropped["too_long"] += 1
                return None
            s.input_ids, s.loss_mask = s.input_ids[: self.cfg.max_length], s.loss_mask[: self.cfg.max_length]
            self.stats.truncations += 1
        if not any(s.loss_mask):
            self.stats.dropped["no_supervised_tokens"] += 1
            return None
        return s


def build_data(
    records_dir: Path,
    out_dir: Path,
    tokenizer_path: Path,
    cfg: DataConfig,
    expected_model: str | None = None,
    check_only: bool = False,
    config_dump: dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> BuildResult:
    """Render, mask, validate and pack every record of a run.

    Args:
        records_dir: ``runs/<run>/records``.
        out_dir: ``runs/<run>/data`` (ignored when ``check_only``).
        tokenizer_path: folder of the target tokenizer.
        cfg: the ``data`` config section.
        expected_model: model name the records must carry (None: not checked).
        check_only: render and validate only; write nothing.
        config_dump: resolved config stored in the manifest.
        trust_remote_code: ``target.trust_remote_code`` (a tokenizer that is the checkpoint's own code).

    Returns:
        A :class:`BuildResult`.

    Raises:
        DataError: no records, a record of another model, a tokenizer without chat template, the mismatch rate or
            drop rate above its threshold.
    """
    t0 = time.monotonic()
    log.info("loading tokenizer from %s", tokenizer_path)
    tok = load_tokenizer(tokenizer_path, cfg.chat_template, trust_remote_code)
    renderer = ChatRenderer(tok, end_of_turn_ids(tok, tokenizer_path), cfg.template_kwargs)
    vsize = target_vocab_size(tok, tokenizer_path)
    t_loaded = time.monotonic()
    files = record_files(records_dir)
    log.info("reading %d record shards from %s", len(files), records_dir)
    out_dir = Path(out_dir)
    if not check_only:
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in artifact.output_files(out_dir):
            old.unlink(missing_ok=True)
    writer = _ShardWriter(out_dir, cfg.shard_samples, not check_only)
    builder = _Builder(tok, renderer, vsize, cfg, writer, expected_model)
    st = builder.stats
    chunk: list[tuple[dict[str, Any], RecordNotes]] = []
    for item in iter_records(files):
        st.records += 1
        if isinstance(item, Skip):
            log.debug("skip %s: %s", item.where, item.reason)
            st.dropped[item.reason] += 1
            continue
        chunk.append(item)
        if len(chunk) >= CHUNK:
            builder.process(chunk)
            chunk = []
            if st.records % (CHUNK * 8) == 0:
                log.info("records %d, samples %d, dropped %d", st.records, len(st.lengths), sum(st.dropped.values()))
    builder.process(chunk)
    writer.flush(vsize)

    stats = st.to_json(renderer.reasoning_mode, time.monotonic() - t0, t_loaded - t0)
    failure = st.failure(cfg, records_dir)
    if failure is not None:
        stats["failed"] = str(failure)
    if check_only:
        if failure:
            raise failure
        return BuildResult(stats, st.mismatches)
    artifact.write_stats(out_dir, stats)
    if failure:
        raise failure
    manifest = _finish(out_dir, writer, tok, tokenizer_path, expected_model, cfg, vsize, config_dump)
    log.info("built %d samples (%d tokens, %d supervised) from %d records; dropped %d %s; %.1f s", stats["samples"],
             stats["tokens"], stats["supervised_tokens"], st.records, stats["dropped"], dict(st.dropped),
             stats["seconds"])
    return BuildResult(stats, st.mismatches, manifest)


def _finish(out_dir, writer, tok, tokenizer_path, expected_model, cfg, vsize, config_dump) -> dict[str, Any]:
    """Write the token counts, the default draft vocabulary and the manifest (last, so it marks completion)."""
    import torch

    counts = writer.counts if writer.counts is not None else torch.zeros(vsize, dtype=torch.int64)
    dhash = data_hash([s["sha256"] for s in writer.shards])
    save_counts(artifact.vocab_dir(out_dir), counts, dhash)
    if counts.sum() > 0:
        write_draft_vocab(artifact.vocab_dir(out_dir), min(cfg.draft_vocab_size, vsize), counts, dhash)
    manifest = {
        "schema": DATA_SCHEMA,
        "tokenizer": {"path": str(tokenizer_path), "sha256": tokenizer_sha256(tok, tokenizer_path)},
        "target_model": expected_model,
        "target_vocab_size": vsize,
        "max_length": cfg.max_length,
        "data_hash": dhash,
        "shards": writer.shards,
        "config": config_dump if config_dump is not None else {"data": cfg.model_dump(mode="json")},
    }
    artifact.write_manifest(out_dir, manifest)
    return manifest
