"""The values of ``miniray.util.metrics`` recorded in one process, their merge across processes,
and the Prometheus text exposition of the result.

Owns: one process's recorded series (``RECORDER``), the snapshot a process hands over, how the
snapshots of several processes combine (counters and histograms add up; a gauge keeps the value
set last, by wall clock), and the text format. Does not own: where snapshots travel
(``host/metric_files.py``), the public classes and their validation (``miniray/util/metrics.py``).
Called by: ``miniray/util/metrics.py`` (recording, rendering), ``worker/execute.py`` (a dirty
recorder is flushed before a call's result goes out).

A snapshot is ``{name: {"kind", "description", "boundaries", "series": {tags: value}}}`` where
``tags`` is a sorted tuple of ``(key, value)`` pairs and ``value`` is a float (counter), a
``(value, time)`` pair (gauge) or ``[bucket counts..., sum, count]`` (histogram; one count per
boundary, then the overflow bucket).
"""

from __future__ import annotations

import bisect
import math
import threading
import time

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


class MetricRecorder:
    """The series one process recorded. ``dirty`` is read without the lock on the result path;
    it is cleared only once a snapshot holding every record so far has been written
    (``mark_flushed``), so a call that recorded never sends its result while its values are
    still unwritten."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict = {}
        self._generation = 0  # records so far
        self.dirty = False

    def declare(self, kind: str, name: str, description: str, boundaries=None) -> None:
        with self._lock:
            self._entry(kind, name, description, boundaries)

    def _entry(self, kind: str, name: str, description: str, boundaries) -> dict:
        entry = self._metrics.get(name)
        if entry is None or entry["kind"] != kind:  # a redefinition replaces, as a registry does
            entry = {"kind": kind, "description": description,
                     "boundaries": sorted(boundaries or ()), "series": {}}
            self._metrics[name] = entry
        return entry

    def record(self, kind: str, name: str, description: str, tags: dict, value: float,
               boundaries=None) -> None:
        key = tuple(sorted(tags.items()))
        with self._lock:
            entry = self._entry(kind, name, description, boundaries)
            series = entry["series"]
            if kind == COUNTER:
                series[key] = series.get(key, 0.0) + value
            elif kind == GAUGE:
                series[key] = (value, time.time())
            else:
                bounds = entry["boundaries"]
                counts = series.get(key)
                if counts is None:
                    counts = series[key] = [0] * (len(bounds) + 1) + [0.0, 0]
                counts[bisect.bisect_left(bounds, value)] += 1  # le: value <= boundary
                counts[-2] += value
                counts[-1] += 1
            self._generation += 1
            self.dirty = True

    def mark_flushed(self, generation: int) -> None:
        """A snapshot taken at ``generation`` was written: clean unless recorded since."""
        with self._lock:
            if self._generation == generation:
                self.dirty = False

    def snapshot_with_generation(self) -> tuple:
        with self._lock:
            return self._generation, self._copy()

    def snapshot(self) -> dict:
        with self._lock:
            return self._copy()

    def _copy(self) -> dict:
        return {name: {**entry, "series": {k: (list(v) if isinstance(v, list) else v)
                                               for k, v in entry["series"].items()}}
                    for name, entry in self._metrics.items()}

    def clear(self) -> None:
        with self._lock:
            self._metrics.clear()
            self.dirty = False


RECORDER = MetricRecorder()


def merge(snapshots: list) -> dict:
    """One snapshot for several processes'. A metric whose kind differs between processes
    keeps the first kind seen; the others' series of that name are dropped."""
    merged: dict = {}
    for snapshot in snapshots:
        for name, entry in snapshot.items():
            into = merged.get(name)
            if into is None:
                into = merged[name] = {**entry, "series": {}}
            elif into["kind"] != entry["kind"] or into["boundaries"] != entry["boundaries"]:
                continue
            series = into["series"]
            for key, value in entry["series"].items():
                old = series.get(key)
                if old is None:
                    series[key] = list(value) if isinstance(value, list) else value
                elif entry["kind"] == COUNTER:
                    series[key] = old + value
                elif entry["kind"] == GAUGE:
                    series[key] = max(old, value, key=lambda pair: pair[1])
                else:
                    series[key] = [a + b for a, b in zip(old, value)]
    return merged


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(tags: tuple, extra: tuple = ()) -> str:
    pairs = list(tags) + list(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{key}="{_escape(str(value))}"' for key, value in pairs) + "}"


def render(snapshot: dict) -> str:
    """The Prometheus text exposition format (version 0.0.4) of a snapshot. A counter's
    samples are named ``<name>_total``, as Prometheus' client libraries name them."""
    lines = []
    for name in sorted(snapshot):
        entry = snapshot[name]
        kind = entry["kind"]
        family = name if kind != COUNTER or name.endswith("_total") else name + "_total"
        help_text = entry["description"].replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {family} {help_text}")
        lines.append(f"# TYPE {family} {kind}")
        for key in sorted(entry["series"]):
            value = entry["series"][key]
            if kind == COUNTER:
                lines.append(f"{family}{_labels(key)} {_number(value)}")
            elif kind == GAUGE:
                lines.append(f"{family}{_labels(key)} {_number(value[0])}")
            else:
                cumulative = 0
                bounds = list(entry["boundaries"]) + [math.inf]
                for bound, count in zip(bounds, value[:-2]):
                    cumulative += count
                    le = (("le", _number(bound)),)
                    lines.append(f"{family}_bucket{_labels(key, le)} {cumulative}")
                lines.append(f"{family}_sum{_labels(key)} {_number(value[-2])}")
                lines.append(f"{family}_count{_labels(key)} {value[-1]}")
    return "\n".join(lines) + ("\n" if lines else "")
