"""The run directory layout: everything a run produces lives under ``<runs_dir>/<run>/``.

::

    runs/<run>/
      config.yaml        resolved config of the last command that wrote to the run
      run-settings.json  the run keys each stage ran with (artifacts/run_settings.py, cli/run_record.py)
      prompts.jsonl      unique prompts extracted by ``enqueue`` (id, messages, source row)
      self_prompts.jsonl user requests written by the target itself (``self-prompts``, Magpie)
      records/           generation shards: <job>.jsonl + <job>.meta.json, manifest.json
      data/              training samples (safetensors) + manifest.json + stats.json + vocab/
      features/          hidden-state shards (safetensors) + manifest.json
      checkpoints/       training checkpoints (step-XXXXXXXX/), latest.json
      export/eagle3/     EAGLE / SpecForge layout; export/speculators/: speculators layout
      eval/              report.json, report.md, report.png
      status/            <stage>.json progress snapshots read by ``draftsmith status``
      logs/              server and worker logs
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from draftsmith.artifacts import checkpoints, data, features, records
from draftsmith.artifacts.location import run_location
from draftsmith.artifacts.status import STATUS_DIR
from draftsmith.artifacts.storage import prepare_run
from draftsmith.errors import ConfigError

_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class RunPaths:
    """Paths of one run. Creating the object touches nothing on disk; :meth:`ensure` makes the folders.

    Raises:
        ConfigError: the run name is not a plain folder name.
    """

    runs_dir: Path
    run: str

    def __post_init__(self) -> None:
        if not _RUN_NAME.match(self.run):
            raise ConfigError(
                f"run name {self.run!r} is not a plain folder name",
                "use letters, digits, '.', '_' or '-' (at most 64 characters)",
            )

    @property
    def root(self) -> Path:
        """``<runs_dir>/<run>``: a :class:`~pathlib.Path`, or an :class:`upath.UPath` when ``runs_dir`` is an
        object-store URL (:mod:`draftsmith.artifacts.location`)."""
        return run_location(self.runs_dir) / self.run

    @property
    def config(self) -> Path:
        """``config.yaml``: resolved config of the last command that wrote to the run."""
        return self.root / "config.yaml"

    @property
    def prompts(self) -> Path:
        """``prompts.jsonl``: the unique prompts of ``enqueue``."""
        return self.root / "prompts.jsonl"

    @property
    def self_prompts(self) -> Path:
        """``self_prompts.jsonl``: user requests the target wrote itself (:mod:`draftsmith.generation.selfprompts`)."""
        return self.root / "self_prompts.jsonl"

    @property
    def records(self) -> Path:
        """``records/``: generation shards (:mod:`draftsmith.artifacts.records`)."""
        return self.root / "records"

    @property
    def data(self) -> Path:
        """``data/``: training samples (:mod:`draftsmith.artifacts.data`)."""
        return self.root / "data"

    @property
    def features(self) -> Path:
        """``features/``: target features (:mod:`draftsmith.artifacts.features`)."""
        return self.root / "features"

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: training checkpoints (:mod:`draftsmith.artifacts.checkpoints`)."""
        return self.root / "checkpoints"

    @property
    def export(self) -> Path:
        """``export/``: exported drafters."""
        return self.root / "export"

    @property
    def eval(self) -> Path:
        """``eval/``: evaluation reports."""
        return self.root / "eval"

    @property
    def status(self) -> Path:
        """``status/``: ``<stage>.json`` progress snapshots."""
        return self.root / STATUS_DIR

    @property
    def logs(self) -> Path:
        """``logs/``: server and worker logs."""
        return self.root / "logs"

    # the files handed from one stage to the next: names owned by draftsmith.artifacts (one module per contract)

    @property
    def records_manifest(self) -> Path:
        """``records/manifest.json`` (:mod:`draftsmith.artifacts.records`)."""
        return records.manifest_path(self.records)

    @property
    def data_manifest(self) -> Path:
        """``data/manifest.json`` (:mod:`draftsmith.artifacts.data`)."""
        return data.manifest_path(self.data)

    @property
    def data_stats(self) -> Path:
        """``data/stats.json`` (:mod:`draftsmith.artifacts.data`)."""
        return data.stats_path(self.data)

    @property
    def vocab(self) -> Path:
        """``data/vocab/`` (:mod:`draftsmith.artifacts.vocab`)."""
        return data.vocab_dir(self.data)

    @property
    def features_manifest(self) -> Path:
        """``features/manifest.json`` (:mod:`draftsmith.artifacts.features`)."""
        return features.manifest_path(self.features)

    @property
    def checkpoints_latest(self) -> Path:
        """``checkpoints/latest.json`` (:mod:`draftsmith.artifacts.checkpoints`)."""
        return checkpoints.latest_path(self.checkpoints)

    def ensure(self, *folders: Path) -> None:
        """Create the run root and the given sub-folders; on an object store (no folders there) check that the
        store answers and its bucket exists instead.

        Raises:
            StorageError: the object store is unreachable, refuses access or lacks the bucket.
        """
        prepare_run(self.root, *folders)
