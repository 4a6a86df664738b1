"""The demo's own files in a run folder: its resolved config (every stage command reads it) and its state (which
stages finished and how long each took), both written by :class:`draftsmith.demo.Demo`."""

from __future__ import annotations

DEMO_CONFIG_FILE = "demo-config.yaml"
DEMO_STATE_FILE = "demo.json"
