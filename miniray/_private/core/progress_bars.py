"""Progress bars of ``tqdm_ray``: their state on the wire, their text, and which to show.

Owns the pure parts: a bar's state as one line on a worker's stdout (encode/decode), the
board of bars the driver knows (their order, which are live, when a line is due in a log),
and the text of one bar. Does not own: writing to a terminal (``owner/progress_display.py``),
reading the worker's pipe (``owner/output.py``) or the public ``tqdm`` class
(``miniray/experimental/tqdm_ray.py``).

A worker sends a bar's whole state each time (at most once a second per bar, and when it
closes), as Ray does, so a lost or throttled update never leaves the driver behind for good::

    worker: tqdm.update() --> b"\\x00mb:" + JSON + b"\\n" on fd 1 --> driver's output reader
        --> decode() --> display: BarBoard.apply() --> stderr (in place on a tty, else lines)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

# Marks a bar update on a worker's stdout; never shown (output.py takes such lines out).
BAR_MARKER = b"\x00mb:"
# A bar's lines in a log (stderr not a terminal): at most one per bar this often, plus the
# first and the last.
LOG_INTERVAL_S = 5.0
_FIELDS = {"uuid": str, "pid": int, "x": (int, float), "pos": int, "desc": str, "unit": str,
           "closed": bool}


def encode(state: dict) -> bytes:
    """One update line for a worker's stdout (a single ``write``: atomic in a pipe)."""
    return BAR_MARKER + json.dumps(state, separators=(",", ":")).encode() + b"\n"


def decode(payload: bytes | str) -> dict | None:
    """The state carried by an update line (marker included or not); None if malformed."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "replace")
    if payload.startswith(BAR_MARKER):
        payload = payload[len(BAR_MARKER):]
    try:
        state = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(state, dict):
        return None
    for name, kind in _FIELDS.items():
        if not isinstance(state.get(name), kind):
            return None
    for name in ("total", "start"):
        value = state.get(name)
        if value is not None and not isinstance(value, (int, float)):
            return None
    return state


@dataclass
class Bar:
    """A bar the driver shows: the last state it got, when the driver first saw it (its
    ``started``, unless the state says when the bar was created: ``time.time()`` of the same
    host), and when a log last got a line of it."""

    state: dict
    label: str  # the source's prefix plus the bar's description
    order: tuple
    started: float
    logged_at: float | None = None
    logged_x: float | None = None


@dataclass
class BarBoard:
    """The driver's bars, keyed by (source, uuid). Pure: the caller passes the time."""

    bars: dict = field(default_factory=dict)
    _sources: dict = field(default_factory=dict)  # source -> rank, in order of first sight
    _count: int = 0

    def apply(self, source: str, prefix: str, state: dict, now: float) -> Bar:
        """Record an update; returns the bar (``state["closed"]``: it leaves the board)."""
        key = (source, state["uuid"])
        label = prefix + state["desc"]
        bar = self.bars.get(key)
        if bar is None:
            rank = self._sources.setdefault(source, len(self._sources))
            self._count += 1
            bar = Bar(state, label, (rank, state["pos"], self._count), now)
            self.bars[key] = bar
        bar.state, bar.label = state, label
        if state["closed"]:
            del self.bars[key]
        return bar

    def live(self) -> list:
        """The bars still open, in screen order: by source, then position, then age."""
        return sorted(self.bars.values(), key=lambda bar: bar.order)

    @staticmethod
    def log_due(bar: Bar, now: float, interval: float = LOG_INTERVAL_S) -> bool:
        """Whether a log (not a terminal) gets a line for this update: the first one, the
        last one, and otherwise one per ``interval`` when the count moved."""
        if bar.state["closed"] or bar.logged_at is None:
            return True
        return now - bar.logged_at >= interval and bar.state["x"] != bar.logged_x

    @staticmethod
    def logged(bar: Bar, now: float) -> None:
        bar.logged_at, bar.logged_x = now, bar.state["x"]


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def format_bar(bar: Bar, now: float, width: int = 100) -> str:
    """tqdm's look: ``desc: 40%|████      | 4/10 [00:02<00:03, 2.00it/s]``, at most
    ``width`` characters (a wrapped line would break redrawing in place). ``now`` is wall
    time (``time.time()``)."""
    state = bar.state
    x, total, unit = state["x"], state.get("total"), state["unit"]
    start = state.get("start")
    elapsed = max(0.0, now - (bar.started if start is None else start))
    rate = x / elapsed if elapsed > 0 else 0.0
    head = f"{bar.label}: " if bar.label else ""
    rate_text = f"{rate:.2f}{unit}/s" if rate else f"?{unit}/s"
    if total:
        fraction = min(1.0, max(0.0, x / total))
        remaining = _duration((total - x) / rate) if rate and x < total else "00:00"
        if not rate and x < total:
            remaining = "?"
        tail = f" {_count(x)}/{_count(total)} [{_duration(elapsed)}<{remaining}, {rate_text}]"
        percent = f"{fraction * 100:3.0f}%|"
        room = max(10, min(40, width - len(head) - len(percent) - len(tail) - 1))
        filled = int(fraction * room)
        line = f"{head}{percent}{'█' * filled}{' ' * (room - filled)}|{tail}"
    else:
        line = f"{head}{_count(x)}{unit} [{_duration(elapsed)}, {rate_text}]"
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"
