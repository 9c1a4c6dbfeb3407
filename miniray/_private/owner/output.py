"""Worker output forwarding: a worker's stdout/stderr pipe, read by the owner's I/O thread.

Owns: splitting a worker's output into lines, turning the worker's marker lines into the
``(<name> pid=<pid>) `` prefix, and writing the lines to the driver's stdout or stderr. Does not
own: the pipes' lifetime (the owner creates and closes them) or when to read (the I/O thread).
Called by: owner.py.

Marker lines (``\\x00mr:<pid>:<name>``) are written by the worker before a task whose name
differs from the previous task's; they are never shown.
"""

from __future__ import annotations

import os
import select
import sys
import time

MARKER = b"\x00mr:"


class OutputStream:
    __slots__ = ("fd", "target", "enabled", "prefix_enabled", "buffer", "prefix", "eof", "closed",
                 "route")

    def __init__(self, fd: int, target: str, enabled: bool, prefix_enabled: bool):
        self.fd = fd
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
        for line in lines:  # a task's last line without a newline runs into the next marker
            position = line.find(MARKER)
            if position > 0:
                split.append(line[:position])
                split.append(line[position:])
            else:
                split.append(line)
        for line in split:
            if line.startswith(MARKER):
                pid, _, name = line[len(MARKER):].decode("utf-8", "replace").partition(":")
                self.prefix = f"({name} pid={pid}) "
                continue
            text = line.decode("utf-8", "replace")
            out.append((self.prefix + text) if self.prefix_enabled else text)
        if out and self.route is not None and self.route(self.target, "\n".join(out) + "\n"):
            return
        if out and self.enabled:
            stream = sys.stdout if self.target == "stdout" else sys.stderr
            try:
                stream.write("\n".join(out) + "\n")
                stream.flush()
            except Exception:  # a closed or broken driver stream must not kill the I/O thread
                pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                os.close(self.fd)
            except OSError:
                pass
