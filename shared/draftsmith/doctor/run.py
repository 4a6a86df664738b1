"""The run as the doctor reads it: every artifact loaded once, on first use, and None where the run lacks it.

Inputs (docs/formats.md): ``records/`` (the target's answers, with the ids the server tokenized and generated),
``prompts.jsonl`` (each prompt's source, the sample family), ``data/`` (samples, loss masks, draft vocabulary),
``features/manifest.json`` (aux layer ids), the latest checkpoint's ``state.json`` (the drafter as trained and the
resolved config), ``status/train.json`` (the training's simulated acceptance), ``eval/report.json`` and the export
folders (either layout).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from draftsmith.artifacts import data as data_artifact
from draftsmith.artifacts import features as features_artifact
from draftsmith.artifacts import records as records_artifact
from draftsmith.artifacts import vocab
from draftsmith.artifacts.export import LAYOUTS, layout_dir
from draftsmith.artifacts.report import read_report
from draftsmith.artifacts.status import snapshot_path
from draftsmith.drafter.config import DraftConfig
from draftsmith.errors import DraftsmithError
from draftsmith.log import get_logger
from draftsmith.target.checkpoint import read_target_config, target_config_path

log = get_logger(__name__)


class DoctorInputError(DraftsmithError):
    """The run or the drafter given to ``doctor`` cannot be read (exit code 2)."""


class RunView:
    """Lazy, read-only view of one run folder.

    Args:
        root: ``runs/<run>``.
        drafter: export folders to check (either layout); default: the run's ``export/eagle3`` and
            ``export/speculators`` that exist.
        target: the target checkpoint folder; default: the one the latest checkpoint names, else the settings'.

    Raises:
        DoctorInputError: ``root`` is not a folder, or a given drafter folder does not exist.
    """

    def __init__(self, root: Path, drafter: Path | None = None, target: Path | None = None,
                 settings_target: Path | None = None) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DoctorInputError(f"no run folder at {self.root}", "pass --run with the name of an existing run "
                                   "(runs_dir comes from the config)")
        if drafter is not None and not Path(drafter).is_dir():
            raise DoctorInputError(f"no drafter folder at {drafter}", "pass --drafter with an export folder "
                                   "(runs/<run>/export/eagle3 or export/speculators)")
        self._drafter = Path(drafter) if drafter else None
        self._target = Path(target) if target else None
        self._settings_target = settings_target

    # --- exports ---------------------------------------------------------------------------------------------
    @property
    def export_dirs(self) -> list[Path]:
        """The export folders to check."""
        if self._drafter is not None:
            return [self._drafter]
        return [d for lay in LAYOUTS if (d := layout_dir(self.root / "export", lay)).is_dir()]

    @cached_property
    def exports(self) -> list[tuple[Path, str, dict, dict]]:
        """``[(folder, layout, config, weights by internal name)]``.

        Raises:
            DoctorInputError: a folder without a readable config or weights, or of neither layout.
        """
        from draftsmith.drafter.load import read_export

        out = []
        for d in self.export_dirs:
            try:
                layout, config, weights = read_export(d)
            except DraftsmithError as e:
                raise DoctorInputError(f"cannot read the drafter export {d}: {e.message}", e.hint) from e
            except ValueError as e:  # a config that is not JSON
                raise DoctorInputError(f"cannot read the drafter export {d}: {e}", "re-export the drafter") from e
            out.append((d, layout, config, weights))
        return out

    # --- training --------------------------------------------------------------------------------------------
    @cached_property
    def state(self) -> dict[str, Any] | None:
        """``state.json`` of the latest checkpoint (``drafter``: the trained config, ``config``: the resolved
        settings, ``target``), or None."""
        from draftsmith.drafter.checkpoint import latest_checkpoint, read_state

        ckpt = latest_checkpoint(self.root / "checkpoints") if (self.root / "checkpoints").is_dir() else None
        return read_state(ckpt) if ckpt else None

    @cached_property
    def drafter_config(self):
        """The :class:`~draftsmith.drafter.config.DraftConfig` the drafter was trained with, or None."""
        return DraftConfig.from_dict(self.state["drafter"]) if self.state else None

    @property
    def settings(self) -> dict[str, Any]:
        """The resolved settings the run trained with (``state.json``), else its ``config.yaml``, else ``{}``."""
        if self.state and self.state.get("config"):
            return self.state["config"]
        f = self.root / "config.yaml"
        if f.is_file():
            import yaml

            return yaml.safe_load(f.read_text()) or {}
        return {}

    @cached_property
    def train_status(self) -> dict[str, Any] | None:
        """``status/train.json`` (the training log's last figures), or None."""
        f = snapshot_path(self.root, "train")
        return json.loads(f.read_text()) if f.is_file() else None

    @cached_property
    def target(self) -> Path | None:
        """The target checkpoint folder, or None when neither the checkpoint nor the settings name one."""
        for p in (self._target, (self.state or {}).get("target"), self._settings_target):
            if p and target_config_path(p).is_file():
                return Path(p)
        return None

    @cached_property
    def target_config(self) -> dict[str, Any] | None:
        """The target's text config, or None."""
        return read_target_config(self.target, text=True) if self.target else None

    @cached_property
    def tokenizer(self):
        """The target's tokenizer, or None."""
        if self.target is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.target))

    # --- data ------------------------------------------------------------------------------------------------
    @cached_property
    def data_manifest(self) -> dict[str, Any] | None:
        """``data/manifest.json``, or None."""
        return data_artifact.read_manifest(self.root / "data") if data_artifact.manifest_path(
            self.root / "data").is_file() else None

    @cached_property
    def samples(self) -> dict[str, tuple]:
        """``{sample_id: (input_ids int64 [T], loss_mask bool [T])}`` of every data shard ({} without data)."""
        out: dict[str, tuple] = {}
        for entry in (self.data_manifest or {}).get("shards", []):
            shard = data_artifact.read_shard(self.root / "data", entry)
            for sid, ids, mask in zip(entry["sample_ids"], shard.input_ids, shard.loss_mask, strict=True):
                out[sid] = (ids, mask)
        return out

    @property
    def data_lengths(self) -> list[int]:
        """Token length of every training sample."""
        return [n for e in (self.data_manifest or {}).get("shards", []) for n in e["lengths"]]

    @cached_property
    def draft_vocab(self):
        """``(d2t [N], t2d [V])`` of the run's draft vocabulary (the size the drafter was trained with, else the
        only one in ``data/vocab``), or None."""
        from draftsmith.drafter.vocab import load_draft_vocab

        vdir = self.root / "data" / data_artifact.VOCAB_DIR
        sizes = vocab.mapping_sizes(vdir) if vdir.is_dir() else []
        n = self.drafter_config.draft_vocab_size if self.drafter_config else (sizes[0] if len(sizes) == 1 else None)
        if n is None or n not in sizes:
            return None
        d2t, t2d, _ = load_draft_vocab(self.root / "data", n)
        return d2t, t2d

    @cached_property
    def features_manifest(self) -> dict[str, Any] | None:
        """``features/manifest.json`` (unvalidated), or None."""
        return features_artifact.load_manifest(self.root / "features")

    # --- records ---------------------------------------------------------------------------------------------
    @cached_property
    def records(self) -> dict[str, dict[str, Any]]:
        """``{prompt id: record}`` of the ``ok`` records, the first of each id in shard-name order."""
        out: dict[str, dict[str, Any]] = {}
        rdir = self.root / "records"
        if not rdir.is_dir():
            return out
        for shard in records_artifact.shard_files(rdir):
            for r in records_artifact.parse_shard(shard, shard.read_text().splitlines()):
                if r.get("status") == "ok" and r.get("id") not in out:
                    out[r["id"]] = r
        return out

    @cached_property
    def families(self) -> dict[str, str]:
        """``{prompt id: source}`` from ``prompts.jsonl`` (the sample family), {} without it."""
        f = self.root / "prompts.jsonl"
        if not f.is_file():
            return {}
        rows = (json.loads(line) for line in f.read_text().splitlines() if line.strip())
        return {r["id"]: str(r.get("source") or "?") for r in rows}

    # --- evaluation ------------------------------------------------------------------------------------------
    @cached_property
    def report(self) -> dict[str, Any] | None:
        """``eval/report.json``, or None.

        Raises:
            DoctorInputError: the report is not JSON or of another schema.
        """
        try:
            return read_report(self.root / "eval")
        except ValueError as e:
            raise DoctorInputError(f"cannot read the eval report: {e}", "re-run `draftsmith eval`") from e
