"""Training samples and target features for the trainer: readers of ``docs/formats.md`` sections 3 and 4.

``FeatureSource`` is the small protocol both feature paths implement: offline shards (:class:`OfflineFeatures`)
and features streamed from the extractor (``draftsmith.features.stream``). The trainer only asks for a batch of
sample ids and gets ``aux_hidden [T, 3*H]`` and ``final_hidden [T, H]`` per sample.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as features_artifact
from draftsmith.errors import DataError
from draftsmith.features.stream import FeatureStream
from draftsmith.log import get_logger

log = get_logger(__name__)


@runtime_checkable
class FeatureSource(Protocol):
    """Where target features come from. ``layer_ids`` in the convention of ``draftsmith.drafter.config``."""

    hidden_size: int
    layer_ids: list[int]
    target_model: str
    skipped: dict[str, str]  # sample id -> reason, for samples the extraction left out (e.g. ``nonfinite``)

    def get(self, sample_ids: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``[(aux_hidden [T, 3*H], final_hidden [T, H]), ...]`` in the order of ``sample_ids``.

        Raises:
            DataError: a sample has no features.
        """
        ...


@dataclass
class Sample:
    """One training sample: ``input_ids`` int64 ``[T]``, ``loss_mask`` bool ``[T]``."""

    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor


class TrainSamples:
    """All samples of ``runs/<run>/data/`` in memory (ids and masks are small next to features).

    Raises:
        DataError: missing manifest or shard, unknown schema, or no sample at all.
    """

    def __init__(self, data_dir: Path | str) -> None:
        self.dir = Path(data_dir)
        self.manifest = dict(data_artifact.read_manifest(self.dir))
        self.samples: dict[str, Sample] = {}
        for shard in self.manifest["shards"]:
            read = data_artifact.read_shard(self.dir, shard)
            for sid, ids, mask in zip(shard["sample_ids"], read.input_ids, read.loss_mask, strict=True):
                self.samples[sid] = Sample(sid, ids, mask)
        if not self.samples:
            raise DataError(f"the training data in {self.dir} holds no sample", f"check build-data's {data_artifact.STATS_FILE}")

    @property
    def target_model(self) -> str:
        return str(self.manifest.get("target_model", ""))

    def split(self, eval_fraction: float) -> tuple[list[str], list[str]]:
        """Deterministic train / held-out split by a hash of each sample id (:func:`held_out`)."""
        train, held = [], []
        for sid in sorted(self.samples):
            (held if held_out(sid, eval_fraction) else train).append(sid)
        if not train:
            raise DataError("no training sample left after the held-out split", "lower train.eval_fraction")
        return train, held


def held_out(sample_id: str, eval_fraction: float) -> bool:
    """Whether the sample is in the held-out split: the first 8 hex digits of the id's SHA-256, as a share of
    ``0xFFFFFFFF``, below ``eval_fraction`` (a sample stays on its side whatever else the data holds)."""
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < eval_fraction


class OfflineFeatures:
    """Feature shards of ``runs/<run>/features/`` read lazily, one sample slice at a time."""

    def __init__(self, features_dir: Path | str) -> None:
        self.dir = Path(features_dir)
        self.manifest = features_artifact.read_manifest(self.dir)
        self.hidden_size = int(self.manifest["hidden_size"])
        self.layer_ids = [int(i) for i in self.manifest["layer_ids"]]
        self.target_model = str(self.manifest.get("target_model", ""))
        self.index: dict[str, tuple[Path, int]] = {}
        self.skipped: dict[str, str] = {}  # left out by extraction and recorded in the manifest: not missing
        for shard in self.manifest.get("shards", []):
            for i, sid in enumerate(shard["sample_ids"]):
                self.index[sid] = (self.dir / shard["file"], i)
            for e in shard.get("skipped") or []:
                self.skipped[str(e["id"])] = str(e.get("reason", "unknown"))

    def get(self, sample_ids: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from safetensors import safe_open

        out = []
        for sid in sample_ids:
            if sid in self.skipped:
                raise DataError(f"sample {sid} was skipped by extraction ({self.skipped[sid]})",
                                "leave it out of training (the trainer does so and counts it)")
            if sid not in self.index:
                raise DataError(f"sample {sid} has no features in {self.dir}", "re-run `draftsmith extract`")
            path, i = self.index[sid]
            with safe_open(str(path), "pt") as f:
                off = f.get_slice("offsets")[i : i + 2].tolist()
                aux = f.get_slice("aux_hidden")[off[0] : off[1]]  # [T, 3H]
                fin = f.get_slice("final_hidden")[off[0] : off[1]]  # [T, H]
            out.append((aux, fin))
        return out


def make_batches(
    lengths: dict[str, int], max_tokens: int, max_batch: int, seed: int, epoch: int, bucket_factor: int = 16
) -> list[list[str]]:
    """Length-bucketed batches of sample ids; a deterministic function of ``(seed, epoch)``.

    Samples are shuffled, cut into pools of ``bucket_factor * max_batch``, sorted by length inside each pool and
    packed greedily so that ``batch_size * longest <= max_tokens`` (padding stays small); the batch order is then
    shuffled. A sample longer than ``max_tokens`` is a batch of its own.
    """
    rng = random.Random(seed * 1000003 + epoch)
    ids = sorted(lengths)
    rng.shuffle(ids)
    pool = bucket_factor * max_batch
    batches: list[list[str]] = []
    for s in range(0, len(ids), pool):
        chunk = sorted(ids[s : s + pool], key=lambda i: lengths[i])
        cur: list[str] = []
        for sid in chunk:
            longest = max([lengths[c] for c in cur] + [lengths[sid]])
            if cur and (len(cur) + 1 > max_batch or (len(cur) + 1) * longest > max_tokens):
                batches.append(cur)
                cur = []
            cur.append(sid)
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def usable_split(samples: TrainSamples, features: FeatureSource, eval_fraction: float) -> tuple[list[str], list[str], int]:
    """Train / held-out sample ids without the samples extraction left out (recorded in the features manifest, e.g.
    NaN hidden states), and how many those are: a skip in extraction is honoured here, not refused.

    Raises:
        DataError: extraction left out every training sample.
    """
    train, held = samples.split(eval_fraction)
    skipped = dict(getattr(features, "skipped", None) or {})
    gone = [i for i in train + held if i in skipped]
    if gone:
        log.warning("leaving out %d sample(s) that extraction skipped (%s)", len(gone),
                    ", ".join(sorted({skipped[i] for i in gone})))
        train = [i for i in train if i not in skipped]
        held = [i for i in held if i not in skipped]
    if not train:
        raise DataError(f"extraction skipped all {len(gone)} training samples (see features/"
                        f"{features_artifact.MANIFEST_FILE})", "check the target and extract.dtype, then re-extract")
    return train, held, len(gone)


def collate(
    samples: list[Sample], feats: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Right-pad a batch: ``input_ids [B, T]``, ``loss_mask [B, T]``, ``aux [B, T, 3H]``, ``final [B, T, H]``,
    ``lengths [B]``.

    Raises:
        DataError: a sample's features and tokens differ in length (features from other data).
    """
    T = max(s.input_ids.numel() for s in samples)
    B = len(samples)
    H3, H = feats[0][0].shape[-1], feats[0][1].shape[-1]
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    aux = torch.zeros(B, T, H3, dtype=dtype)
    fin = torch.zeros(B, T, H, dtype=dtype)
    for b, (s, (a, f)) in enumerate(zip(samples, feats, strict=True)):
        n = s.input_ids.numel()
        if a.shape[0] != n or f.shape[0] != n:
            raise DataError(
                f"sample {s.id}: {n} tokens but features for {a.shape[0]}",
                "the features were extracted from other data; re-run `draftsmith extract`",
            )
        ids[b, :n], mask[b, :n] = s.input_ids, s.loss_mask
        aux[b, :n], fin[b, :n] = a.to(dtype), f.to(dtype)
    lengths = torch.tensor([s.input_ids.numel() for s in samples])
    return {"input_ids": ids, "loss_mask": mask, "aux": aux, "final": fin, "lengths": lengths}


class StreamedFeatures:
    """:class:`FeatureSource` over ``draftsmith.features.stream.FeatureStream`` (no feature store on disk).

    A sample the stream rejects as non-finite comes back as NaN tensors, which the trainer skips and counts.
    """

    def __init__(self, settings, run_dir: Path, samples: TrainSamples) -> None:
        self.stream = FeatureStream.from_settings(settings, Path(run_dir))
        self.samples = samples
        self.hidden_size = int(self.stream.plan.hidden_size)
        self.layer_ids = [int(i) for i in self.stream.plan.layer_ids]
        self.target_model = str(self.stream.plan.target_model)
        self.skipped: dict[str, str] = {}  # the stream reports non-finite samples as NaN tensors instead

    def get(self, sample_ids: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        seqs = [self.samples.samples[i].input_ids for i in sample_ids]
        out = []
        for ids, f in zip(seqs, self.stream.features(seqs), strict=True):
            if f is None:
                n = ids.numel()
                out.append((torch.full((n, 3 * self.hidden_size), float("nan")),
                            torch.full((n, self.hidden_size), float("nan"))))
            else:
                out.append((f.aux, f.final))
        return out
