"""The documents' ``ray start --head`` / ``ray.init(address="auto")`` examples across two
fake hosts.

Each example (``s000_05_ray_start_head.sh``, ``s003_08_cuda_visible_devices_at_start.sh`` in
the doc-examples folder) starts a GPU head with the document's command, then runs a driver
that connects with ``ray.init(address="auto")`` and asks for GPUs. Here the head is on
127.0.0.1, a member without GPUs joins it from 127.0.0.2, and the example's driver runs on the
member's host (its own session root and shared-memory tag), so every GPU task must travel to
the head and back. The output must match what the manifest expects of the one-host run, and
nothing may be left on either host (the ``hosts`` fixture checks both).

The document's command is run as written, except that the head listens on a free port
instead of 6379 (``helpers.cli`` adds ``--port 0``: the default port belongs to
``test_node_cli.py``); the driver finds the node with ``address="auto"`` either way.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import cli, wait_until
from .test_cluster_join import hosts_fixture  # noqa: F401 - the fixture `hosts`

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = Path(os.environ.get("MINIRAY_DOC_EXAMPLES") or REPO.parent / "shared" / "doc-examples")
CASES = ("s000_05_ray_start_head.sh", "s003_08_cuda_visible_devices_at_start.sh")


def _example(name: str) -> tuple[dict, list[str], str, dict]:
    """(environment of the doc command, its ``ray start`` arguments, the driver's Python
    source, the manifest's expectations) of one shell example."""
    path = EXAMPLES / name
    manifest = EXAMPLES / "manifest.json"
    if not path.is_file() or not manifest.is_file():
        pytest.skip(f"the doc examples are not at {EXAMPLES} (set MINIRAY_DOC_EXAMPLES)")
    text = path.read_text()
    command = text.split("# --- doc ---\n", 1)[1].split("# --- end doc ---", 1)[0].strip()
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[:2] == ["ray", "start"], command
    source = text.split("python - <<'PY'\n", 1)[1].split("\nPY", 1)[0]
    entries = {e["file"]: e for e in json.loads(manifest.read_text())["examples"]}
    return env, words[2:], source, entries[name]["expect"]


@pytest.mark.parametrize("name", CASES)
def test_a_documents_gpu_head_serves_a_driver_on_another_host(hosts, tmp_path, name):
    env, start_args, source, expect = _example(name)
    head_env = dict(hosts.env("127.0.0.1"), **env)
    started = cli(head_env, "start", *start_args, "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    head = hosts.record("127.0.0.1").address
    joined = hosts.join("127.0.0.2", head, "--num-cpus", "2", "--num-gpus", "0")
    assert joined.returncode == 0, joined.stderr
    assert wait_until(lambda: (hosts.cluster("127.0.0.2").get("127.0.0.1") or {}).get("alive"),
                      5.0)
    script = tmp_path / "driver.py"
    script.write_text(source)
    ran = subprocess.run([sys.executable, "-m", "miniray", "run", str(script)],
                         env=hosts.env("127.0.0.2"), capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == expect["exit_code"], ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    for pattern in expect["stdout_all"]:
        assert any(re.match(pattern, line) for line in lines), (pattern, ran.stdout,
                                                               ran.stderr)
    # The driver ran on the member, which has no GPU: the head's GPUs ran every task.
    view = hosts.cluster("127.0.0.2")
    assert "GPU" not in view["127.0.0.2"]["totals"], view
    assert view["127.0.0.1"]["totals"]["GPU"] >= 2, view
