"""Streamed features: the trainer asks for a batch's features computed on the fly, with no feature store.

For targets whose features would not fit on disk (``(3 + 1) * H * 2`` bytes per token in bf16: 1.1 TB for 10,000 x 2,000 tokens of Kimi-K2, H = 7168). The
values are exactly the stored ones: same backend, same batch plan for the same samples, same cast to the stored
dtype, same NaN/Inf rule (tests/features/test_stream.py compares them bit for bit).

Usage::

    stream = FeatureStream.from_settings(settings, run_dir)
    feats = stream.features(batch_input_ids)      # list of SampleFeatures or None (non-finite, skipped)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftsmith.features.hf import SampleFeatures, torch_dtype
from draftsmith.features.jobs import finite, get_extractor
from draftsmith.features.plan import ExtractPlan, make_plan, read_data_shard
from draftsmith.log import get_logger

log = get_logger(__name__)


class FeatureStream:
    """On-the-fly features in the stored layout.

    Args:
        extractor: a backend (``extract(seqs) -> [SampleFeatures]``), e.g. :class:`~draftsmith.features.hf.HFExtractor`.
        plan: the run's :class:`~draftsmith.features.plan.ExtractPlan` (layers, dtype, data shards).

    Attributes:
        skipped: samples returned as None because their features held NaN or Inf.
    """

    def __init__(self, extractor: Any, plan: ExtractPlan) -> None:
        self.extractor = extractor
        self.plan = plan
        self.dtype = torch_dtype(plan.dtype)
        self.skipped = 0

    @classmethod
    def from_settings(cls, settings, run_dir: Path) -> FeatureStream:
        """Validate the run like ``draftsmith extract`` does and load the backend.

        Raises:
            DataError / ModelError / ConfigError: see :func:`draftsmith.features.plan.make_plan`.
        """
        plan = make_plan(settings, Path(run_dir))
        return cls(get_extractor(plan, settings), plan)

    def features(self, seqs: Sequence[torch.Tensor]) -> list[SampleFeatures | None]:
        """Features of a batch of samples.

        Args:
            seqs: token ids, each ``[T_s]``.

        Returns:
            Per sample a :class:`SampleFeatures` with ``aux`` ``[T_s, 3*H]`` and ``final`` ``[T_s, H]`` in the
            stored dtype, or None when a value is NaN or Inf (counted in :attr:`skipped`).
        """
        out: list[SampleFeatures | None] = []
        for f in self.extractor.extract(seqs):
            a, h = f.aux.to(self.dtype), f.final.to(self.dtype)  # [T, 3*H], [T, H]
            if finite(a) and finite(h):
                out.append(SampleFeatures(a, h))
            else:
                self.skipped += 1
                out.append(None)
        if self.skipped:
            log.debug("streamed features: %d non-finite samples skipped so far", self.skipped)
        return out

    def shard(self, index: int) -> tuple[list[str], list[SampleFeatures | None]]:
        """Features of every sample of data shard ``index`` (sample ids, features), as the store would hold them."""
        entry = self.plan.shards[index]
        return list(entry["sample_ids"]), self.features(read_data_shard(self.plan.data_dir, entry))
