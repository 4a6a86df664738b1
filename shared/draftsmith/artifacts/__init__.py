"""The hand-offs between stages: one module per on-disk contract (docs/formats.md).

Each module owns the file names of its contract, its schema tag, and the typed reader and validator every consumer
uses (and the writer of its manifest-like JSON where the producer writes one). Producers and consumers both import
it; no other module spells these file names or parses these files.

* :mod:`draftsmith.artifacts.records`: generation records (``records/``), formats.md §2.
* :mod:`draftsmith.artifacts.data`: training samples, their manifest and ``stats.json`` (``data/``), §3.
* :mod:`draftsmith.artifacts.vocab`: the draft vocabulary (``data/vocab/``), §3.
* :mod:`draftsmith.artifacts.features`: target features (``features/``), §4.
* :mod:`draftsmith.artifacts.checkpoints`: training checkpoints (``checkpoints/``), §5.

The modules import nothing heavy at import time (no torch), so :mod:`draftsmith.paths` can name their files.
"""
