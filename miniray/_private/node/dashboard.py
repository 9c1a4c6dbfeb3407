"""``miniray dashboard``: one local web page showing the live sessions, served by the stdlib.

Owns: the HTTP server (``http.server``, one thread per request), who may read it, and the
collection behind its JSON endpoint. Does not own: the page (``dashboard_page.py``), the
pure checks and the page's model (``core/dashboard_model.py``), the snapshots
(``state_api.gather``, one per live driver per request).

Security model: the dashboard shows what the state API shows (function names, pids,
resources), so it is readable only by the user who started it:

1. It binds 127.0.0.1 by default; a non-loopback host needs ``--allow-remote``.
2. A random token made at start is required on every request: in the URL printed on the
   user's terminal (``/?token=...``), which answers with a cookie (``HttpOnly;
   SameSite=Strict``) and a redirect to ``/``, so the token leaves the address bar.
   Compared in constant time. Without it: 403.
3. A loopback peer must run as this uid: its socket's owner is looked up in
   ``/proc/net/tcp`` (``host/tcp_peer.py``); another uid, or a connection the table does not
   list, gets 403. Where the platform has no such table the token alone decides.
4. The Host header must name the bound address and port (DNS rebinding: a page of another
   site whose name resolves to 127.0.0.1 is refused). No CORS header is ever sent.

Each request to ``/api/state`` asks every live driver's state socket once, with a short
timeout: a driver that vanishes or does not answer is named in the page, never waited on.
Called by: ``cli.py`` (``miniray dashboard``; ``miniray start --include-dashboard`` runs that
command through ``daemon.spawn_dashboard``, and ``miniray stop`` stops it by its record).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from miniray._private import state_api
from miniray._private.core import dashboard_model
from miniray._private.core.resources import UNIT, from_units
from miniray._private.host import procinfo, tcp_peer
from miniray._private.ledger.ledger import Ledger
from miniray._private.node import dashboard_page, node_status
from miniray._private.node.daemon import DASHBOARD_RECORD

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8265  # Ray's
DEFAULT_HOST = "127.0.0.1"
ASK_TIMEOUT_S = 2.0  # per driver and request: a busy driver is shown as missing, not waited on


def _ledger_parts(view) -> tuple[list[dict], list[dict]]:
    try:
        state = Ledger(os.path.join(view.session_dir, "ledger.json")).snapshot()
    except (OSError, ValueError):
        return [], []
    used = state.used()
    resources = [{"name": name, "used": from_units(used.get(name, 0)),
                  "total": from_units(total)}
                 for name, total in sorted(state.totals.items())
                 if not name.startswith("node:")]
    keys = list(getattr(view.record, "gpu_keys", None) or ())
    gpus = dashboard_model.gpu_bars(state.instance_ids.get("GPU", []),
                                    state.instance_free("GPU"), UNIT, keys)
    return resources, gpus


def collect_model(address: str | None, timeout: float = ASK_TIMEOUT_S) -> dict:
    """The page's model for the sessions ``address`` names (None: every live session of
    the user's root): one snapshot per live driver, the ledgers, the published demands."""
    now_ms = int(time.time() * 1000)
    try:
        views = state_api.gather(address, timeout)
    except (ConnectionError, ValueError, OSError) as error:
        model = dashboard_model.build_model([], [], [], [], [], [], [], now_ms)
        model["error"] = str(error)
        return model
    resources: list[dict] = []
    gpus: list[dict] = []
    drivers = []
    for view in views:
        parts = _ledger_parts(view)
        resources += parts[0]
        gpus += parts[1]
        published = node_status.published_stats(view.session_dir) if view.record is not None else {}
        for doc in view.drivers:
            pid = doc["driver"]["pid"]
            drivers.append({"pid": pid, "store": doc["driver"].get("store") or {},
                            "demands": (published.get(pid) or {}).get("demands") or ()})
    missing = [f"driver pid {pid}: {why}" for v in views for pid, why in v.missing]
    return dashboard_model.build_model(
        state_api.rows("nodes", views), state_api.rows("tasks", views),
        state_api.rows("actors", views), drivers, resources, gpus, missing, now_ms)


_PAGES = ("/", "/app.js", "/api/state")


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "miniray-dashboard"
    sys_version = ""

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, content_type: str, extra=()) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'self'; connect-src 'self'; "
                         "style-src 'unsafe-inline'; frame-ancestors 'none'")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, code: int, why: str) -> None:
        self._send(code, (why + "\n").encode(), "text/plain; charset=utf-8")

    def _peer_problem(self) -> str | None:
        peer = self.client_address
        if not dashboard_model.is_loopback(peer[0]):
            return None  # a remote peer (--allow-remote): the token decides
        uid = tcp_peer.peer_uid(peer, self.connection.getsockname())
        if uid == tcp_peer.UNKNOWN or uid == os.getuid():
            return None
        if uid is None:
            return "the connection's owner cannot be verified"
        return "the connection comes from another user"

    def _check(self) -> bool:
        server = self.server
        if not dashboard_model.host_ok(self.headers.get("Host"), server.bound_host,
                                       server.server_port):
            self._refuse(403, "Forbidden: the Host header does not name this dashboard.")
            return False
        problem = self._peer_problem()
        if problem is not None:
            self._refuse(403, f"Forbidden: {problem}.")
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if not self._check():
            return
        server = self.server
        parts = urlsplit(self.path)
        in_query = dashboard_model.query_token(parts.query)
        if dashboard_model.token_ok(in_query, server.token):
            # Keep it in a cookie, and take it out of the address bar and the history.
            cookie = (f"{dashboard_model.COOKIE}={server.token}; HttpOnly; SameSite=Strict; "
                      "Path=/")
            # Back to one of our own pages only (never an address the query could name).
            where = parts.path if parts.path in _PAGES else "/"
            self._send(303, b"", "text/plain", [("Set-Cookie", cookie), ("Location", where)])
            return
        if not dashboard_model.token_ok(
                dashboard_model.cookie_token(self.headers.get("Cookie")), server.token):
            self._refuse(403, "Forbidden: open the URL with the token that `miniray "
                              "dashboard` printed.")
            return
        if parts.path == "/":
            self._send(200, dashboard_page.PAGE.encode(), "text/html; charset=utf-8")
        elif parts.path == "/app.js":
            script = f"const POLL_MS = {dashboard_page.POLL_MS};\n" + dashboard_page.SCRIPT
            self._send(200, script.encode(), "text/javascript; charset=utf-8")
        elif parts.path == "/api/state":
            model = server.collect()
            self._send(200, json.dumps(model).encode(), "application/json")
        else:
            self._refuse(404, "Not found.")

    do_HEAD = do_GET

    def _not_allowed(self) -> None:
        self._refuse(405, "Method not allowed: the dashboard only reads.")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server, with the token, the bound host and the model's source."""

    daemon_threads = True

    def __init__(self, host: str, port: int, token: str, collect: Callable[[], dict]):
        if ":" in host:
            import socket  # lazy: only an IPv6 bind needs the family

            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self.bound_host = host
        self.token = token
        self.collect = collect

    @property
    def url(self) -> str:
        host = f"[{self.bound_host}]" if ":" in self.bound_host else self.bound_host
        return f"http://{host}:{self.server_port}/?token={self.token}"


def check_host(host: str, allow_remote: bool) -> str | None:
    """Why ``host`` may not be bound, or None."""
    if dashboard_model.is_loopback(host) or allow_remote:
        return None
    return (f"--host {host} would let other hosts reach the dashboard; pass --allow-remote "
            "to accept that (the token is still required), or bind 127.0.0.1.")


def _watch(server: DashboardServer, session_dir: str) -> None:
    """Stops ``server`` once ``session_dir`` is gone (its node stopped or was swept)."""
    while os.path.isdir(session_dir):
        time.sleep(1.0)
    server.shutdown()


def run(host: str, port: int, address: str | None, on_ready: Callable[[str], None],
        record_dir: str | None = None) -> int:
    """Serves until SIGINT or SIGTERM. ``on_ready(url)`` once listening. With ``record_dir``
    (a node's session), records this process there so ``miniray stop`` stops it."""
    server = DashboardServer(host, port, dashboard_model.new_token(),
                             lambda: collect_model(address))
    record = None
    if record_dir is not None:
        record = os.path.join(record_dir, DASHBOARD_RECORD)
        with open(record + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "start": procinfo.start_time(os.getpid())}, f)
        os.replace(record + ".tmp", record)

    def stop(_signum, _frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    if record_dir is not None:  # a node's dashboard ends with the node's session
        threading.Thread(target=_watch, args=(server, record_dir), daemon=True,
                         name="miniray-dashboard-watch").start()
    try:
        on_ready(server.url)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        if record is not None:
            try:
                os.unlink(record)
            except OSError:
                pass
    return 0


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DashboardServer", "check_host", "collect_model",
           "run"]
