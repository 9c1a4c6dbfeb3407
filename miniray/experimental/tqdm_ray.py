"""``tqdm_ray``: progress bars in tasks and actors, drawn once, by the driver.

Mirrors ``ray.experimental.tqdm_ray`` (Ray 2.60): ``tqdm(iterable, desc, total, unit,
position, flush_interval_s)`` with ``update``, ``set_description``, ``refresh``, ``close``,
``n`` and ``total``; ``safe_print``. A bar in a worker sends its whole state to the driver at
most once per ``flush_interval_s`` (1 s) and when it closes; the driver draws every bar on its
stderr, one line each, prefixed with the worker's ``(<task> pid=<pid>)``: in place on a
terminal, otherwise a line when a bar appears, every few seconds while it moves, and when it
closes. Differs: miniray draws the bars itself (Ray needs the ``tqdm`` package in the
driver and shows nothing without it); a bar closes when its iterable is exhausted and works as
a context manager, as ``tqdm.tqdm`` does (Ray's leaves it open); ``close`` twice sends one
final state; the worker prefix is miniray's output prefix (Ray's bars say ``(pid=N)``).

Example:
    >>> @ray.remote
    ... def work(n):
    ...     for _ in tqdm_ray.tqdm(range(n), desc="work"):
    ...         time.sleep(0.1)
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Iterable, Iterator

from miniray._private import api

__all__ = ["safe_print", "tqdm"]


def safe_print(*args, **kwargs) -> None:
    """``print`` that does not tear the progress bars drawn on the driver's terminal."""
    api.safe_print(*args, **kwargs)


class tqdm:  # noqa: N801 (Ray's name)
    """A progress bar usable in tasks, actors and the driver; the driver draws it.

    Args:
        iterable: what to iterate over (each item counts one); optional.
        desc: the bar's label.
        total: the expected count (``len(iterable)`` when it has one).
        unit: the unit's name ("it").
        position: the bar's line among those of the same process (0 first).
        flush_interval_s: the least time between two updates sent to the driver (1 s).
    """

    DEFAULT_FLUSH_INTERVAL_SECONDS = 1.0

    def __init__(self, iterable: Iterable | None = None, desc: str | None = None,
                 total: int | None = None, unit: str | None = None,
                 position: int | None = None, flush_interval_s: float | None = None):
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except (TypeError, AttributeError):
                total = None
        self._iterable = iterable
        self._desc = desc or ""
        self._total = total
        self._unit = unit or "it"
        self._pos = position or 0
        self._pid = os.getpid()
        self._uuid = uuid.uuid4().hex
        self._x: float = 0
        self._closed = False
        self._flush_interval_s = (self.DEFAULT_FLUSH_INTERVAL_SECONDS
                                  if flush_interval_s is None else flush_interval_s)
        self._last_flush_time = 0.0
        self._start = time.time()  # the driver's rate and times count from here

    def set_description(self, desc: str) -> None:
        self._desc = desc
        self._dump_state()

    def update(self, n: float = 1) -> None:
        self._x += n
        self._dump_state()

    def refresh(self) -> None:
        self._dump_state()

    def close(self) -> None:
        """The bar's last state goes to the driver now; a closed bar ignores a second close."""
        if self._closed:
            return
        self._closed = True
        self._dump_state(force_flush=True)

    @property
    def total(self) -> int | None:
        return self._total

    @total.setter
    def total(self, total: int | None) -> None:
        self._total = total

    @property
    def n(self) -> float:
        return self._x

    @n.setter
    def n(self, n: float) -> None:
        self._x = n

    def __iter__(self) -> Iterator:
        if self._iterable is None:
            raise ValueError("No iterable provided")
        for item in self._iterable:
            self.update(1)
            yield item
        self.close()

    def __enter__(self) -> tqdm:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _dump_state(self, force_flush: bool = False) -> None:
        now = time.time()
        if not force_flush and now - self._last_flush_time < self._flush_interval_s:
            return
        self._last_flush_time = now
        api.show_progress_bar(self._state())

    def _state(self) -> dict:
        return {"x": self._x, "pos": self._pos, "desc": self._desc, "total": self._total,
                "unit": self._unit, "pid": self._pid, "uuid": self._uuid,
                "closed": self._closed, "start": self._start}
