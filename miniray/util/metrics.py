"""``miniray.util.metrics``: application metrics recorded in any process of a session.

Mirrors ``ray.util.metrics`` (Ray 2.60): ``Counter``, ``Gauge``, ``Histogram`` with the same
arguments, ``set_default_tags``, ``inc``/``set``/``observe`` with ``tags``, ``info``, Ray's
validation errors and warnings, and pickling by definition (a metric created in the driver
records in the task that receives it). Differs: nothing is exported to a metrics agent.
Instead, ``prometheus_text()`` (a miniray addition) renders, in the driver, the values
recorded by every process of the session in the Prometheus text exposition format.

Values recorded in a worker reach the driver when the call that recorded them returns its
result (or when the worker exits): ``get`` a task's result, then read. Values an actor
records from a thread of its own show up with its next call's result.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Dict, List, Tuple, Union

from miniray._private.core import metric_values

__all__ = ["Counter", "Gauge", "Histogram", "prometheus_text"]

_VALID_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _discarded(name: str) -> bool:
    """Ray's check: an empty name raises; an invalid one warns and the metric records nothing."""
    if len(name) == 0:
        raise ValueError("Empty name is not allowed. Please provide a metric name.")
    if not _VALID_NAME.match(name):
        warnings.warn(
            f"Invalid metric name: {name}. Metric will be discarded and data will not be "
            "collected or published. Metric names can only contain letters, numbers, _, "
            "and :. Metric names cannot start with numbers.", UserWarning, stacklevel=3)
        return True
    return False


def _check_value(value: Any) -> None:
    if not isinstance(value, (int, float)):
        raise TypeError(f"value must be int or float, got {type(value)}.")


class Metric:
    """The parent of the metric classes: name, description, tag keys and default tags."""

    _kind = ""

    def __init__(self, name: str, description: str = "",
                 tag_keys: Tuple[str, ...] | None = None):
        self._discard_metric = _discarded(name)
        self._name = name
        self._description = description
        self._default_tags: Dict[str, str] = {}
        self._tag_keys = tag_keys or tuple()
        if not isinstance(self._tag_keys, tuple):
            raise TypeError(f"tag_keys should be a tuple type, got: {type(self._tag_keys)}")
        for key in self._tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"Tag keys must be str, got {type(key)}.")
        if ":" in self._name:
            warnings.warn(
                f"Metric name {self._name} contains a : character, which is no longer "
                "allowed. Please migrate to the new metric name format. This will be an "
                "error in the future.", FutureWarning, stacklevel=2)

    def _declare(self, boundaries=None) -> None:
        if not self._discard_metric:
            metric_values.RECORDER.declare(self._kind, self._name, self._description,
                                           boundaries)

    def set_default_tags(self, default_tags: Dict[str, str]) -> Metric:
        """Tags used by every record call unless it overrides them; returns the metric."""
        for key, value in default_tags.items():
            if key not in self._tag_keys:
                raise ValueError(f"Unrecognized tag key {key}.")
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)}.")
        self._default_tags = default_tags
        return self

    def _final_tags(self, tags: Dict[str, str] | None) -> Dict[str, str]:
        if not tags:
            final = self._default_tags
        else:
            for value in tags.values():
                if not isinstance(value, str):
                    raise TypeError(f"Tag values must be str, got {type(value)}.")
            final = {**self._default_tags, **tags}
        missing = [key for key in self._tag_keys if key not in final]
        if missing:
            raise ValueError(f"Missing value for tag key(s): {','.join(missing)}.")
        return final

    def _record(self, value: Union[int, float], tags: Dict[str, str] | None,
                boundaries=None) -> None:
        if self._discard_metric:
            return
        final = self._final_tags(tags)
        metric_values.RECORDER.record(self._kind, self._name, self._description, final,
                                      float(value), boundaries)

    @property
    def info(self) -> Dict[str, Any]:
        """The metric's name, description, tag keys and default tags."""
        return {"name": self._name, "description": self._description,
                "tag_keys": self._tag_keys, "default_tags": self._default_tags}


class Counter(Metric):
    """A cumulative value that only goes up (Prometheus' counter)."""

    _kind = metric_values.COUNTER

    def __init__(self, name: str, description: str = "",
                 tag_keys: Tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        self._declare()

    def __reduce__(self):
        return self.__class__, (self._name, self._description, self._tag_keys)

    def inc(self, value: Union[int, float] = 1.0, tags: Dict[str, str] = None) -> None:
        """Add ``value`` (default 1, must be > 0)."""
        _check_value(value)
        if value <= 0:
            raise ValueError(f"value must be >0, got {value}")
        self._record(value, tags)


class Gauge(Metric):
    """The last value set (Prometheus' gauge)."""

    _kind = metric_values.GAUGE

    def __init__(self, name: str, description: str = "",
                 tag_keys: Tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        self._declare()

    def __reduce__(self):
        return Gauge, (self._name, self._description, self._tag_keys)

    def set(self, value: Union[int, float] | None, tags: Dict[str, str] = None) -> None:
        """Set the gauge to ``value``; ``None`` does nothing."""
        if value is None:
            return
        _check_value(value)
        self._record(value, tags)


class Histogram(Metric):
    """Counts of observations in buckets bounded by ``boundaries`` (Prometheus' histogram)."""

    _kind = metric_values.HISTOGRAM

    def __init__(self, name: str, description: str = "", boundaries: List[float] = None,
                 tag_keys: Tuple[str, ...] | None = None):
        super().__init__(name, description, tag_keys)
        if boundaries is None or len(boundaries) == 0:
            raise ValueError(
                "boundaries argument should be provided when using the Histogram class. "
                'e.g., Histogram("name", boundaries=[1.0, 2.0])')
        for index, boundary in enumerate(boundaries):
            if boundary <= 0:
                raise ValueError(
                    f"Invalid `boundaries` argument at index {index}, {boundaries}. "
                    "Use positive values for the arguments.")
        self.boundaries = boundaries
        self._declare(boundaries)

    def __reduce__(self):
        return Histogram, (self._name, self._description, self.boundaries, self._tag_keys)

    def observe(self, value: Union[int, float], tags: Dict[str, str] = None) -> None:
        """Count ``value`` in its bucket."""
        _check_value(value)
        self._record(value, tags, self.boundaries)

    @property
    def info(self) -> Dict[str, Any]:
        """As ``Metric.info``, with the boundaries."""
        return {**super().info, "boundaries": self.boundaries}


def prometheus_text() -> str:
    """The metrics recorded by every process of the current session (this one's included),
    merged, in the Prometheus text exposition format: counters and histograms summed over
    processes, a gauge's value the one set last. A miniray addition (Ray exports to its
    metrics agent instead). Without a session, this process's own values."""
    from miniray._private import api  # lazy: importing the metrics loads no engine

    return api.metrics_text()
