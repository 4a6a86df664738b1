"""What made an artifact: code version and config hash stamped by the owners' writers, shown by `status`."""

from __future__ import annotations

import json
import subprocess


def test_code_version_names_the_package_and_the_checkout():
    from draftsmith.artifacts.provenance import code_version

    v = code_version()
    assert v.startswith("draftsmith 0.")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a clone (CI's is one): the commit is named
        assert "(git " in v and head.stdout.strip()[:7] in v, v


def test_stamp_hashes_the_config_it_carries():
    from draftsmith.artifacts.provenance import code_version, stamp

    a = stamp({"config": {"b": 1, "a": [1, 2]}, "x": 1})
    b = stamp({"x": 2, "config": {"a": [1, 2], "b": 1}})
    assert a["code_version"] == code_version() and a["config_sha256"] == b["config_sha256"]
    assert stamp({"config": {"a": 1}})["config_sha256"] != a["config_sha256"]
    assert "config_sha256" not in stamp({"x": 1})


def test_manifests_written_by_their_owners_are_stamped_and_status_shows_it(tmp_path):
    from draftsmith.artifacts import data, features
    from draftsmith.artifacts.provenance import code_version
    from draftsmith.paths import RunPaths
    from draftsmith.status import made_by

    paths = RunPaths(tmp_path, "r")
    data.write_manifest(paths.data, {"schema": data.DATA_SCHEMA, "shards": [], "config": {"max_length": 8}})
    features.write_manifest(paths.features, {"schema": features.FEATURES_SCHEMA, "shards": []})
    m = json.loads(paths.data_manifest.read_text())
    assert m["code_version"] == code_version() and len(m["config_sha256"]) == 64
    assert json.loads(paths.features_manifest.read_text())["code_version"] == code_version()
    assert made_by(paths) == [f"made by {code_version()} (data, features)"]
    f = json.loads(paths.features_manifest.read_text())
    paths.features_manifest.write_text(json.dumps({**f, "code_version": "draftsmith 0.0.9"}))
    assert made_by(paths) == [f"made by: data {code_version()}", "made by: features draftsmith 0.0.9"]
