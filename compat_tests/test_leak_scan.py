"""The harness's scan of the user's own miniray folders (``conftest.gained_in_places``)."""

from __future__ import annotations

import os

from .conftest import gained_in_places, snapshot_places, user_places


def test_a_place_created_or_grown_during_a_run_is_reported(tmp_path):
    grown, created, quiet = tmp_path / "grown", tmp_path / "created", tmp_path / "quiet"
    grown.mkdir()
    (grown / "old").write_text("")
    quiet.mkdir()
    before = snapshot_places([str(grown), str(created), str(quiet)])
    (grown / "new").write_text("")
    created.mkdir()
    (created / "gpus.json").write_text("{}")
    assert gained_in_places(before) == [
        os.path.join(str(grown), "new"), f"{created} (created, holding ['gpus.json'])"]


def test_the_users_places_are_the_defaults_not_the_runs():
    root, host = user_places()
    assert root == f"/dev/shm/miniray-{os.getuid()}"
    assert os.path.basename(host) == f"miniray-host-{os.getuid()}"
