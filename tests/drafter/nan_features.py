"""A stored-feature source whose aux features are NaN for chosen samples: what a broken kernel or an fp16 overflow
gives (a real NaN cannot be provoked on this CPU target). A module-level class, so that it pickles: the trainer's
loader workers are spawned processes and read the features through it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from draftsmith.drafter.data import OfflineFeatures


class NaNFeatures(OfflineFeatures):
    """:class:`OfflineFeatures` of ``features_dir`` with ``aux [T, 3H]`` all NaN for the sample ids in ``bad``."""

    def __init__(self, features_dir: Path | str, bad: Iterable[str]) -> None:
        super().__init__(features_dir)
        self.bad = set(bad)

    def get(self, sample_ids: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = super().get(sample_ids)
        return [(a * float("nan"), f) if sid in self.bad else (a, f) for sid, (a, f) in zip(sample_ids, out, strict=True)]
