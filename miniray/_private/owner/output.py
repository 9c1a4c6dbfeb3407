"""Worker output forwarding: a worker's stdout/stderr pipe, read by the owner's I/O thread.

Owns: splitting a worker's output into lines, turning the worker's marker lines into the
``(<name> pid=<pid>) `` prefix (``(<name> pid=<pid>, ip=<ip>) `` for a worker on another
host), and writing the lines to the driver's stdout or stderr. Does not own: the pipes'
lifetime (the owner creates and closes them) or when to read (the I/O thread; for a worker
on another host, the reader thread of ``remote_nodes.py``).
Called by: owner.py, remote_nodes.py. Each chunk read also goes, raw, to the worker's log
file (``host/worker_logs.py``) when the session keeps them.

Marker lines (``\\x00mr:<pid>:<name>``) are written by the worker before a task whose name
differs from the previous task's; they are never shown. Or the owner names the task itself
(``name``), when it sends a new name's TASK to an idle worker whose pipes it has just read to
the end: what follows is that task's, and the worker, told so (``NAMED``), writes no marker.
Both give the same lines, prefixes and log files; the owner's way costs no pipe writes and no
wake-up of its I/O thread (on a 2-core machine, that thread competing for the GIL with the
``get()`` waiting for the result). Bar lines (``\\x00mb:<json>``, from
``tqdm_ray`` in the worker) go to the driver's progress display instead of being printed
(``progress_display.py``); routed output (an actor of the node's actor service) carries them
on, with the prefix inside, to the driver that created the actor, whose ``deliver`` shows them.
While bars are drawn in place, forwarded lines are written above them.
"""

from __future__ import annotations

import os
import re
import select
import sys
import time

from miniray._private.core import progress_bars
from miniray._private.owner import progress_display

MARKER = b"\x00mr:"
# Where a marker starts inside a line: a task's last line without a newline runs into it.
_ANY_MARKER = re.compile(b"\x00m[rb]:")


class OutputStream:
    __slots__ = ("fd", "target", "enabled", "prefix_enabled", "buffer", "prefix", "eof", "closed",
                 "route", "log", "early", "where", "lock", "marks")

    EARLY_MAX = 65536  # bytes kept for the log file until the worker's pid is known

    def __init__(self, fd: int, target: str, enabled: bool, prefix_enabled: bool,
                 ip: str | None = None):
        self.fd = fd
        self.where = f", ip={ip}" if ip else ""  # a worker on another host: Ray names its IP
        self.target = target  # "stdout" or "stderr"
        self.enabled = enabled
        self.prefix_enabled = prefix_enabled
        self.buffer = b""
        self.prefix = ""
        self.eof = False  # the write end is closed everywhere; the owner then closes fd
        self.closed = False
        # route(target, text) -> bool: sends the lines elsewhere (the actor service passes an
        # actor's output to the driver that created it); False: print them here after all.
        self.route = None
        # The worker's log file (host/worker_logs.py), once its pid is known; until then what
        # it printed waits in ``early`` (None: no log file is kept).
        self.log = None
        self.early: bytearray | None = None
        # Its worker's output lock (``WorkerSlot.output_lock``), held around each drain.
        self.lock = None
        # Marker lines of the names given by ``name``, for the log file: written with the
        # next bytes read or at close, not while a task is being sent.
        self.marks = b""

    def open_log(self, log) -> None:
        """Write to ``log`` (a ``worker_logs.CappedLog``) from now on, after what came early."""
        if self.early:
            log.write(bytes(self.early))
        self.early = None
        self.log = log

    def _flush_marks(self) -> None:
        if self.marks and self.log is not None:
            self.log.write(self.marks)
        self.marks = b""

    def name(self, pid: int, name: str) -> None:
        """What follows in the pipe is ``name``'s output: as a marker line read here would
        do (a partial last line is the earlier task's; the log file gets the marker). The
        caller holds ``lock`` and has read the pipe to its end."""
        if self.buffer:
            self._emit(b"", eof=True)
        if self.log is not None:
            self.marks += MARKER + f"{pid}:{name}\n".encode("utf-8", "replace")
        elif self.early is not None and len(self.early) < self.EARLY_MAX:
            self.early += MARKER + f"{pid}:{name}\n".encode("utf-8", "replace")
        self.prefix = f"({name} pid={pid}{self.where}) "

    def drain(self) -> None:
        """Read what is available now (non-blocking) and print the complete lines."""
        if self.eof or self.closed:
            return
        chunks = []
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._emit(b"".join(chunks), eof=True)
                self.eof = True
                return
            chunks.append(chunk)
            if len(chunk) < 65536:
                break
        if chunks:
            self._emit(b"".join(chunks), eof=False)

    def drain_until_eof(self, deadline: float) -> None:
        while not self.eof and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                ready, _, _ = select.select([self.fd], [], [], remaining)
            except (OSError, ValueError):
                break
            if not ready:
                break
            self.drain()
        if self.buffer and not self.eof:
            self._emit(b"", eof=True)

    def _emit(self, data: bytes, eof: bool) -> None:
        if data:  # the log file gets the raw bytes, markers included (read back by the CLI)
            if self.log is not None:
                if self.marks:  # the names given before these bytes, in one write
                    self.log.write(self.marks + data)
                    self.marks = b""
                else:
                    self.log.write(data)
            elif self.early is not None and len(self.early) < self.EARLY_MAX:
                self.early += data
        data = self.buffer + data
        lines = data.split(b"\n")
        if eof:
            self.buffer = b""
            if lines and lines[-1] == b"":
                lines.pop()
        else:
            self.buffer = lines.pop()
        if not lines:
            return
        out = []
        split = []
        for line in lines:
            match = _ANY_MARKER.search(line, 1)
            if match:
                split.append(line[:match.start()])
                split.append(line[match.start():])
            else:
                split.append(line)
        for line in split:
            if line.startswith(MARKER):
                pid, _, name = line[len(MARKER):].decode("utf-8", "replace").partition(":")
                self.prefix = f"({name} pid={pid}{self.where}) "
                continue
            if line.startswith(progress_bars.BAR_MARKER):
                self._bar(line, out)
                continue
            text = line.decode("utf-8", "replace")
            out.append((self.prefix + text) if self.prefix_enabled else text)
        if out and self.route is not None and self.route(self.target, "\n".join(out) + "\n"):
            return
        if out and self.enabled:
            deliver(self.target, "\n".join(out) + "\n")

    def _bar(self, line: bytes, out: list) -> None:
        """A bar update: shown by the display, or kept (prefix inside) for the route."""
        state = progress_bars.decode(line)
        if state is None or not self.enabled:
            return
        state["prefix"] = self.prefix if self.prefix_enabled else ""
        if self.route is not None:
            out.append(progress_bars.encode(state).decode().rstrip("\n"))
        else:
            progress_display.display().apply(str(state["pid"]), state["prefix"], state)

    def close(self) -> None:
        if self.log is not None:
            self._flush_marks()
            self.log.close()
        if not self.closed:
            self.closed = True
            try:
                os.close(self.fd)
            except OSError:
                pass


def deliver(target: str, text: str) -> None:
    """Write forwarded output to the driver's ``target`` stream; bar lines in it (routed from
    the actor service) go to the progress display."""
    if progress_bars.BAR_MARKER.decode() in text:
        kept = []
        for line in text.split("\n"):
            state = (progress_bars.decode(line)
                     if line.startswith(progress_bars.BAR_MARKER.decode()) else None)
            if state is None:
                kept.append(line)
                continue
            prefix = state.get("prefix") if isinstance(state.get("prefix"), str) else ""
            progress_display.display().apply(str(state["pid"]), prefix, state)
        text = "\n".join(kept)
        if not text.strip("\n"):
            return
    stream = sys.stdout if target == "stdout" else sys.stderr
    try:
        progress_display.display().write_above(stream, text)
    except Exception:  # a closed or broken driver stream must not kill the I/O thread
        pass
