"""Loopback fake hosts (two, or more) for the benchmarks of work on another node.

Owns: starting a head on 127.0.0.1 and a member on 127.0.0.2, or the members ``hosts``
names (each with its own ``MINIRAY_TMPDIR`` and ``MINIRAY_HOST_DIR``, optionally its own
``MINIRAY_SHM_DIR``, one fresh token), running one driver script on the head's host (or a
member's), and stopping every node and removing their folders afterwards. Used by
``bench_remote_tasks.py``, ``bench_remote_values.py``, ``bench_fetch.py`` and
``bench_service_result.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from miniray._private.transport import node_client

HOSTS = ("127.0.0.1", "127.0.0.2")


def run_on_two_hosts(code: str, *, prefix: str, own_shm_dirs: bool = False,
                     hosts: tuple = HOSTS, driver_ip: str | None = None,
                     shm_root: str = "/dev/shm") -> dict:
    """Run the driver ``code`` on the head's host of a fresh two-host cluster (``hosts``:
    the head's IP, then each member's; ``driver_ip``: another of them to run it on); the
    last JSON object it printed, with the machine's load average added. Exits with the
    driver's stderr if it printed none. ``own_shm_dirs``: each host's store in a folder of
    its own under ``shm_root`` (a memory-backed mount)."""
    base = tempfile.mkdtemp(prefix=prefix)
    shm_base = tempfile.mkdtemp(prefix=prefix, dir=shm_root) if own_shm_dirs else None
    token = "bench-remote-token-" + os.urandom(16).hex()
    envs = {}
    for ip in hosts:
        name = ip.replace(".", "_")
        root = os.path.join(base, name)
        os.makedirs(os.path.join(root, "host"))
        envs[ip] = dict(os.environ, MINIRAY_TMPDIR=os.path.join(root, "tmp"),
                        MINIRAY_HOST_DIR=os.path.join(root, "host"), MINIRAY_AUTH_TOKEN=token)
        envs[ip].pop("RAY_ADDRESS", None)
        if shm_base is not None:
            os.makedirs(os.path.join(shm_base, name))
            envs[ip]["MINIRAY_SHM_DIR"] = os.path.join(shm_base, name)
    cli = [sys.executable, "-m", "miniray"]
    try:
        subprocess.run(cli + ["start", "--head", "--port", "0", "--num-cpus", "2"],
                       env=envs[hosts[0]], capture_output=True, text=True, check=True)
        (record,) = node_client.list_records(envs[hosts[0]]["MINIRAY_TMPDIR"])
        for member in hosts[1:]:
            subprocess.run(cli + ["start", f"--address={record.address}",
                                  "--node-ip-address", member, "--port", "0", "--num-cpus",
                                  "2"], env=envs[member], capture_output=True, text=True,
                           check=True)
        run = subprocess.run([sys.executable, "-c", code], env=envs[driver_ip or hosts[0]],
                             capture_output=True, text=True, timeout=600)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if not lines:
            sys.exit(f"the driver printed no result:\n{run.stderr[-3000:]}")
        doc = json.loads(lines[-1])
        doc["load_average"] = [round(x, 2) for x in os.getloadavg()]
        return doc
    finally:
        for ip in reversed(hosts):
            subprocess.run(cli + ["stop", "--force"], env=envs[ip], capture_output=True,
                           timeout=60)
        shutil.rmtree(base, ignore_errors=True)
        if shm_base is not None:
            shutil.rmtree(shm_base, ignore_errors=True)
