"""``miniray dashboard`` against a live session: the JSON endpoint, its protections, the page
in a real headless browser.

The session (the ``ray`` fixture) holds tasks kept running by a gate file and a live actor;
the dashboard runs as a subprocess of the test (``--port 0``) and is stopped with SIGTERM,
which it answers by exiting 0. Ray 2.60's dashboard has no token; its default port (8265) and
``--dashboard-host``/``--dashboard-port`` names are kept.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from .helpers import wait_until


@pytest.fixture
def dashboard(session_root):
    """Starts ``miniray dashboard --port 0``; yields ``(proc, url)``; stops it (SIGTERM)."""
    proc = subprocess.Popen([sys.executable, "-m", "miniray", "dashboard", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if "http://" not in line:
            proc.kill()
            pytest.fail(f"the dashboard printed no URL: {line!r} {proc.stderr.read()}")
        url = line.split()[-1]
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            pytest.fail("the dashboard did not stop on SIGTERM")
        proc.stdout.close()
        proc.stderr.close()
    assert code == 0, f"the dashboard exited with {code} on SIGTERM"


def _split(url: str) -> tuple[str, int, str]:
    rest = url.split("://", 1)[1]
    hostport, _, query = rest.partition("/?token=")
    host, _, port = hostport.rpartition(":")
    return host, int(port), query


def _get(url: str, path: str, headers=None) -> tuple[int, dict, bytes]:
    host, port, _token = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _cookie(url: str) -> str:
    """The cookie the token URL answers with (and check that answer)."""
    _host, _port, token = _split(url)
    status, headers, _ = _get(url, f"/?token={token}")
    assert status == 303 and headers["Location"] == "/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return cookie.split(";", 1)[0]


@pytest.fixture
def busy(ray, tmp_path):
    """Two ``hold`` tasks running, held by a gate file, and a live ``Keeper`` actor."""
    gate = str(tmp_path / "gate")

    @ray.remote
    def hold(path):
        while not os.path.exists(path):
            time.sleep(0.01)
        return 1

    @ray.remote
    class Keeper:
        def pid(self):
            return os.getpid()

    # Its name is markup: the page must show it as text, never run it.
    keeper = Keeper.options(name="<b>bold</b>").remote()
    actor_pid = ray.get(keeper.pid.remote(), timeout=30)
    refs = [hold.remote(gate) for _ in range(2)]
    from miniray.util import state

    assert wait_until(lambda: sum(t["state"] == "RUNNING" for t in state.list_tasks(
        filters=[("func_or_class_name", "=", "hold")])) == 2, 20)
    yield ray, actor_pid
    open(gate, "w").close()
    assert ray.get(refs, timeout=30) == [1, 1]


def test_json_endpoint_reports_running_tasks_and_actor(busy, dashboard):
    """With the token's cookie the endpoint lists the running tasks by function and the
    actor with its class and pid; without it, or with a foreign Host header, 403."""
    _ray, actor_pid = busy
    _proc, url = dashboard
    host, port, token = _split(url)
    assert host == "127.0.0.1"
    cookie = _cookie(url)
    status, headers, body = _get(url, "/api/state", {"Cookie": cookie})
    assert status == 200, body
    assert not any(h.lower().startswith("access-control") for h in headers)
    model = json.loads(body)
    groups = {g["name"]: g for g in model["task_groups"]}
    assert groups["hold"]["running"] == 2
    actors = [a for a in model["actors"] if a["class_name"] == "Keeper"]
    assert [(a["state"], a["pid"]) for a in actors] == [("ALIVE", actor_pid)]
    assert {b["name"] for b in model["timeline"]["bars"]} >= {"hold"}
    assert any(r["name"] == "CPU" and r["total"] == 2.0 for r in model["resources"])
    assert len(model["nodes"]) == 1 and model["stores"]

    # No token, a wrong one, a token in a cookie of another name: 403.
    for headers_ in ({}, {"Cookie": "miniray_dashboard=wrong"}, {"Cookie": f"x={token}"}):
        status, _, body = _get(url, "/api/state", headers_)
        assert status == 403, (headers_, body)
    status, _, _ = _get(url, "/?token=wrong")
    assert status == 403
    # The token on another path sends back to one of the dashboard's own pages only.
    for path, where in (("/api/state", "/api/state"), ("/elsewhere", "/")):
        status, headers, _ = _get(url, f"{path}?token={token}")
        assert (status, headers["Location"]) == (303, where)
    # DNS rebinding: the right cookie under another name for the host is refused.
    status, _, body = _get(url, "/api/state", {"Cookie": cookie,
                                               "Host": f"evil.example:{port}"})
    assert status == 403 and b"Host" in body
    # The page and its script, with the cookie; writes are refused.
    status, _, page = _get(url, "/", {"Cookie": cookie})
    assert status == 200 and b"miniray dashboard" in page and b"/app.js" in page


def test_another_user_is_refused_even_with_the_token(busy, dashboard):
    """A loopback connection from another uid is refused by the peer check (as root: the
    client drops to uid 65534 and presents the right token and Host)."""
    if os.getuid() != 0 or not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs root (to run a client as another uid) and /proc/net/tcp")
    _proc, url = dashboard
    host, port, token = _split(url)
    code = ("import http.client,sys\n"
            f"c=http.client.HTTPConnection({host!r},{port},timeout=10)\n"
            f"c.request('GET','/api/state',headers={{'Cookie':'miniray_dashboard={token}'}})\n"
            "r=c.getresponse();print(r.status);print(r.read().decode())\n")
    # The system's interpreter: the test's may live where uid 65534 cannot read.
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    try:
        result = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True,
                                timeout=30, preexec_fn=lambda: os.setuid(65534), cwd="/")
    except PermissionError:
        pytest.skip(f"uid 65534 cannot run {python}")
    assert result.stdout.split("\n", 1)[0] == "403", result.stdout + result.stderr
    assert "another user" in result.stdout


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_page_in_a_headless_browser(busy, dashboard, tmp_path):
    """Chromium loads the token URL, follows it to the page, runs its script, and the DOM
    lists the running tasks and the actor; a screenshot is kept as an artifact."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium or chromium-browser on PATH")
    _proc, url = dashboard
    profile = str(tmp_path / "chromium-profile")
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu",
              "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
              "--virtual-time-budget=5000"]
    dom = subprocess.run(common + ["--dump-dom", url], capture_output=True, text=True,
                         timeout=90)
    assert "Tasks (running and queued" in dom.stdout, dom.stderr[-2000:]
    assert "<td>hold</td><td>2</td><td>0</td>" in dom.stdout, dom.stdout[-4000:]
    assert "<td>Keeper</td><td>ALIVE</td>" in dom.stdout
    assert "&lt;b&gt;bold&lt;/b&gt;" in dom.stdout and "<b>bold</b>" not in dom.stdout
    shot = tmp_path / "dashboard.png"
    subprocess.run(common + ["--window-size=1280,900", f"--screenshot={shot}", url],
                   capture_output=True, text=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 1000
    artifacts = os.environ.get("MINIRAY_TEST_ARTIFACTS")
    if artifacts:
        os.makedirs(artifacts, exist_ok=True)
        shutil.copy(shot, os.path.join(artifacts, "dashboard.png"))


def test_a_driver_that_does_not_answer_is_named_not_waited_on(busy, dashboard):
    """A state socket whose driver never answers (a listener that never accepts, recorded
    under a live process's pid) costs the endpoint its 2 s timeout, and the page names it;
    the other driver's rows are still there."""
    import socket

    from miniray._private.host import procinfo
    from miniray._private.transport import node_client, state_socket

    ray, _actor_pid = busy
    session_dir = ray._private.runtime.current().session_dir
    stand_in = subprocess.Popen(["sleep", "60"])
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert wait_until(lambda: procinfo.start_time(stand_in.pid), 5)
        path = os.path.join(session_dir, state_socket.STATE_DIR,
                            f"{stand_in.pid}-{procinfo.start_time(stand_in.pid)}.sock")
        with node_client.sun_path(path) as name:  # session paths can pass 108 bytes
            listener.bind(name)
        listener.listen(4)
        _proc, url = dashboard
        cookie = _cookie(url)
        began = time.monotonic()
        status, _, body = _get(url, "/api/state", {"Cookie": cookie})
        took = time.monotonic() - began
        assert status == 200, body
        model = json.loads(body)
        assert any(f"driver pid {stand_in.pid}" in m for m in model["missing"]), model
        assert {g["name"]: g["running"] for g in model["task_groups"]}["hold"] == 2
        assert took < 8, f"the endpoint took {took:.1f} s"
    finally:
        listener.close()
        stand_in.kill()
        stand_in.wait(timeout=10)
        try:
            os.unlink(path)
        except (OSError, NameError):
            pass
