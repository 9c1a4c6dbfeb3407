"""The dashboard's decisions, as pure functions: who may read it, and what its page shows.

Owns: the request checks of ``miniray dashboard`` (the token, from the query or the cookie,
compared in constant time; the Host header against the bound address, against DNS
rebinding; which hosts count as loopback) and the page's model: the JSON the page polls,
made from the state API's rows (tasks, actors, nodes), the ledger's per-GPU use and the
drivers' store statistics. Everything here is plain data in, plain data out: the unit tests
run it without processes or sockets.
Does not own: serving, collecting the snapshots or reading the ledger
(``node/dashboard.py``), nor the peer's uid (``host/tcp_peer.py``).
Called by: ``node/dashboard.py``.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Iterable, Sequence
from urllib.parse import parse_qs

__all__ = ["COOKIE", "build_model", "cookie_token", "gpu_bars", "host_ok", "is_loopback",
           "new_token", "query_token", "token_ok"]

COOKIE = "miniray_dashboard"
RUNNING = "RUNNING"
DONE = ("FINISHED", "FAILED")
TIMELINE_TASKS = 200  # the most recent finished tasks drawn on the timeline


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_ok(presented: str | None, expected: str) -> bool:
    """True when ``presented`` is ``expected`` (constant-time comparison)."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def query_token(query: str) -> str | None:
    """The ``token`` parameter of a URL's query string, or None."""
    values = parse_qs(query or "").get("token")
    return values[0] if values else None


def cookie_token(header: str | None) -> str | None:
    """The dashboard's cookie value in a ``Cookie`` header, or None."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack bind
    return (mapped or address).is_loopback


def _split_host(header: str) -> tuple[str, str | None]:
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8265
        host, _, rest = header[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if header.count(":") == 1:
        host, _, port = header.partition(":")
        return host, port
    return header, None


def host_ok(header: str | None, bound_host: str, port: int) -> bool:
    """True when a request's Host header names the address the dashboard is bound to, with
    its port (a browser always sends it). A name that merely resolves to it (DNS rebinding:
    ``evil.example`` pointed at 127.0.0.1) is refused; ``localhost`` is accepted for a
    loopback bind, since only the local resolver answers for it."""
    if not header:
        return False
    host, given_port = _split_host(header)
    if given_port != str(port):
        return False
    bound = bound_host.strip("[]").lower()
    if host == bound:
        return True
    if is_loopback(bound) and host in ("localhost", "127.0.0.1", "::1"):
        return True
    if bound in ("0.0.0.0", "::"):  # every address of the host: any literal IP of it
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return False
    return False


def gpu_bars(instance_ids: Sequence[str], free_units: Sequence[int], unit: int,
             keys: Sequence[str | None] = ()) -> list[dict]:
    """One bar per GPU: its index, id, used and free share (0..1) and the percent to draw."""
    bars = []
    for index, (gpu_id, free) in enumerate(zip(instance_ids, free_units)):
        used = max(0, min(unit, unit - free)) / unit
        bars.append({"index": index, "id": gpu_id, "used": round(used, 4),
                     "free": round(1 - used, 4), "percent": round(100 * used, 1),
                     "device": (keys[index] if index < len(keys) else None) or "(logical)"})
    return bars


def _task_groups(tasks: Iterable[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for row in tasks:
        state = row.get("state")
        if state in DONE or row.get("type") == "ACTOR_CREATION_TASK":
            continue
        name = row.get("func_or_class_name") or row.get("name") or "?"
        group = groups.setdefault(name, {"name": name, "running": 0, "queued": 0})
        group["running" if state == RUNNING else "queued"] += 1
    return sorted(groups.values(), key=lambda g: (-g["running"], -g["queued"], g["name"]))


def _timeline(tasks: Iterable[dict], now_ms: int) -> dict:
    """Rows per worker pid, a bar per task from its creation (or start) to its end (now
    while it runs). Tasks with no worker or no start time are left out."""
    bars = []
    for row in tasks:
        pid = row.get("worker_pid")
        begin = row.get("start_time_ms") or row.get("creation_time_ms")
        if not pid or not begin or row.get("type") == "ACTOR_CREATION_TASK":
            continue
        running = row.get("state") == RUNNING
        end = now_ms if running else row.get("end_time_ms")
        if not end:
            continue
        bars.append({"pid": pid, "name": row.get("name") or row.get("func_or_class_name"),
                     "state": row.get("state"), "start_ms": begin, "end_ms": max(end, begin)})
    bars.sort(key=lambda b: b["end_ms"])
    bars = bars[-TIMELINE_TASKS:]
    start = min((b["start_ms"] for b in bars), default=now_ms)
    pids = sorted({b["pid"] for b in bars})
    return {"start_ms": start, "end_ms": now_ms, "pids": pids, "bars": bars}


def build_model(nodes: list[dict], tasks: list[dict], actors: list[dict], drivers: list[dict],
                resources: list[dict], gpus: list[dict], missing: list[str],
                now_ms: int) -> dict:
    """The JSON the page polls. ``nodes``, ``tasks``, ``actors``: the state API's rows;
    ``drivers``: each driver's ``{"pid", "store", "demands"}``; ``resources``: ``{"name",
    "used", "total"}``; ``gpus``: ``gpu_bars``; ``missing``: drivers that did not answer."""
    stores = [{"pid": d["pid"], **(d.get("store") or {})} for d in drivers]
    if stores:  # the store is not leased: its use is what the drivers' stores hold
        in_memory = sum(s.get("bytes_in_memory") or 0 for s in stores)
        resources = [dict(r, used=in_memory) if r["name"] == "object_store_memory" else r
                     for r in resources]
    demands = [{"pid": d["pid"], "name": item[0], "shape": item[1], "count": item[2],
                "infeasible": bool(item[3]) if len(item) > 3 else False}
               for d in drivers for item in (d.get("demands") or ())]
    actor_rows = [{"actor_id": a.get("actor_id"), "class_name": a.get("class_name"),
                   "state": a.get("state"), "pid": a.get("pid"), "name": a.get("name") or ""}
                  for a in actors]
    actor_rows.sort(key=lambda a: (a["state"] != "ALIVE", a["class_name"] or "", a["name"]))
    return {
        "now_ms": now_ms,
        "nodes": [{"node_id": n.get("node_id"), "address": n.get("address"),
                   "state": n.get("state"), "session_dir": n.get("session_dir")}
                  for n in nodes],
        "resources": [{**r, "percent": round(100 * r["used"] / r["total"], 1)
                       if r.get("total") else 0.0} for r in resources],
        "gpus": gpus,
        "task_groups": _task_groups(tasks),
        "actors": actor_rows,
        "stores": stores,
        "demands": demands,
        "timeline": _timeline(tasks, now_ms),
        "missing": list(missing),
    }
