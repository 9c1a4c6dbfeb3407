"""The driver's progress bars (``tqdm_ray``): drawn once, on the driver's stderr.

Owns: the driver process's one ``BarDisplay`` and what it writes. On a terminal the live bars
are a block of lines at the bottom, one per bar, redrawn in place; a bar that closes leaves
its last line above the block, and other output (worker lines, ``safe_print``) is written
above it too, by clearing the block first and drawing it again after. Elsewhere (a log, a
pipe) a bar gets a line when it appears, at most one per ``LOG_INTERVAL_S`` while it moves,
and one when it closes. Does not own: the bars' state and text (``core/progress_bars.py``) or
reading workers' pipes (``output.py``, which hands it bar updates and, while bars are drawn,
the lines it forwards). Called by: ``output.py`` on the I/O thread, and by the public
``tqdm_ray`` for bars of the driver itself, so every method takes the display's lock.

While bars are drawn in place, ``print`` is replaced by ``safe_print`` (as Ray does; not with
``RAY_TQDM_PATCH_PRINT=0``), so the program's own prints do not tear the block.
"""

from __future__ import annotations

import builtins
import shutil
import sys
import threading
import time

from miniray._private.core import config
from miniray._private.core.progress_bars import BarBoard, format_bar

_print = builtins.print
_CLEAR_LINE = "\x1b[2K"


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # a replaced or closed stream
        return False


class BarDisplay:
    """The bars shown by this driver; ``stream`` is its stderr unless given (tests)."""

    def __init__(self, stream=None):
        self._stream = stream
        self._lock = threading.RLock()
        self.board = BarBoard()
        self.drawn = 0  # lines of the live block on the terminal now
        self.hidden = False

    def __repr__(self) -> str:
        return f"<BarDisplay live={len(self.board.bars)} drawn={self.drawn}>"

    @property
    def stream(self):
        # Resolved at each use: the program (or a test) may replace sys.stderr.
        return self._stream if self._stream is not None else sys.stderr

    def apply(self, source: str, prefix: str, state: dict) -> None:
        """Show an update of a bar of ``source`` (a worker's pid; "" for the driver)."""
        with self._lock:
            now = time.time()
            bar = self.board.apply(source, prefix, state, now)
            stream = self.stream
            try:
                if _is_tty(stream):
                    _patch_print()
                    self._clear(stream)
                    if state["closed"]:
                        stream.write(format_bar(bar, now, self._width()) + "\n")
                    self._draw(stream, now)
                elif self.board.log_due(bar, now):
                    self.board.logged(bar, now)
                    stream.write(format_bar(bar, now) + "\n")
                stream.flush()
            except Exception:  # a closed stderr must not stop the I/O thread
                pass

    def write_above(self, stream, text: str) -> None:
        """Write ``text`` to ``stream`` without tearing the bars drawn in place."""
        with self._lock:
            bars = self.stream
            redraw = self.drawn and _is_tty(bars)
            if redraw:
                self._clear(bars)
                bars.flush()
            stream.write(text)
            stream.flush()
            if redraw:
                self._draw(bars, time.time())
                bars.flush()

    def hide(self) -> None:
        with self._lock:
            self.hidden = True
            if self.drawn:
                self._clear(self.stream)

    def unhide(self) -> None:
        with self._lock:
            self.hidden = False
            if _is_tty(self.stream) and self.board.bars:
                self._draw(self.stream, time.time())
                self.stream.flush()

    def _clear(self, stream) -> None:
        if self.drawn:
            # Up to the block's first line, then clear to the end of the screen.
            stream.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def _draw(self, stream, now: float) -> None:
        if self.hidden:
            return
        width = self._width()
        live = self.board.live()
        stream.write("".join(_CLEAR_LINE + format_bar(bar, now, width) + "\n" for bar in live))
        self.drawn = len(live)

    @staticmethod
    def _width() -> int:
        return max(20, shutil.get_terminal_size((100, 24)).columns - 1)


_display: BarDisplay | None = None
_display_lock = threading.Lock()


def display() -> BarDisplay:
    """This process's display, created on first use."""
    global _display
    with _display_lock:
        if _display is None:
            _display = BarDisplay()
        return _display


def safe_print(*args, **kwargs) -> None:
    """``print`` that keeps the bars intact: they are cleared, the text printed, then they
    are drawn again. Prints to other files go straight through."""
    if kwargs.get("file") not in (None, sys.stdout, sys.stderr) or _display is None:
        _print(*args, **kwargs)
        return
    shown = _display
    shown.hide()
    try:
        _print(*args, **kwargs)
        (kwargs.get("file") or sys.stdout).flush()  # before the bars come back below it
    finally:
        shown.unhide()


def _patch_print() -> None:
    if builtins.print is _print and config.tqdm_patch_print():
        builtins.print = safe_print
