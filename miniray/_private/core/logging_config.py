"""LoggingConfig: the job's logging setup, applied in the driver and in every worker.

Mirrors ``ray.LoggingConfig`` (Ray 2.60, ``ray._private.ray_logging.logging_config``) and the
formatters and record filter it installs. Differs: values a JSON line cannot hold (a user's
``extra=`` object, say) are written with ``str()`` instead of failing the record; re-applying
a config (a second ``init()``) replaces the handler the first one installed instead of adding
another one, so no line is printed twice.

Owns: the config's fields and checks (``encoding``, ``additional_log_standard_attrs``; the
level is checked by ``check_level`` at ``init()``, as Ray accepts any value at
construction), the fields each record carries (``context_fields``: the ids of the current
driver, task or actor, read from the current runtime in ``core/context.py``), the TEXT and
JSON formatters, and ``configure_process``, which installs them on this process's root
logger. Does not own: when a config is applied or how it reaches the workers (``init()`` in
``runtime.py``, then HELLO's ``logging_config``, applied by ``worker/worker_main.py``).
Called by: ``runtime.init`` (the driver), ``worker_main`` (each worker), ``miniray.LoggingConfig``.

A record's path::

    logger.info(...) ──► record factory: ``timestamp_ns`` (int nanoseconds, the same instant
                         as ``created``)
                     ──► root handler's filter: job_id, worker_id, node_id, and in a worker
                         actor_id, task_id, task_name, task_func_name, actor_name (absent when
                         None or "", as Ray leaves them out)
                     ──► TEXT or JSON formatter ──► stderr (a worker's stderr reaches the
                         driver's stderr, with no "(name pid=N)" prefix while a config is set)

``configure_process`` changes only the ``logging`` module's state of this process (the record
factory, the root logger's level and one handler, the ``miniray`` logger's level): no file,
thread or process.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict

from miniray._private.core import context, ids

__all__ = ["LoggingConfig", "check_level", "configure_process", "context_fields"]

ENCODINGS = ("TEXT", "JSON")

# The attributes the logging module sets on every record (Python 3.9-3.13; ``taskName`` is
# 3.12's). Only these may be named in ``additional_log_standard_attrs``; every other
# attribute of a record (an id, a user's ``extra=``) is always written.
STANDARD_ATTRS = frozenset({
    "args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName",
    "levelname", "levelno", "lineno", "message", "module", "msecs", "msg", "name",
    "pathname", "process", "processName", "relativeCreated", "stack_info", "thread",
    "threadName", "taskName",
})

# The first fields of a TEXT line, as Ray's default format: "<time>\t<LEVEL> <file>:<line> --".
TEXT_FORMAT = "%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"

# Where the record factory keeps the nanosecond time; written out as ``timestamp_ns``, last.
_TIMESTAMP_KEY = "_miniray_timestamp_ns"
TIMESTAMP_FIELD = "timestamp_ns"


@dataclass
class LoggingConfig:
    """Logging configuration for a job: the root logger of the driver and of every task's and
    actor's process gets one handler with this encoding and level, and records carry the ids
    of the driver, task or actor that logged them.

    Args:
        encoding: ``"TEXT"`` (``<time>\\t<LEVEL> <file>:<line> -- <message> key=value ...``)
            or ``"JSON"`` (one object per line).
        log_level: the root logger's level in every process (a name such as ``"DEBUG"``, or a
            number); an unknown name is refused by ``init()``.
        additional_log_standard_attrs: standard ``LogRecord`` attributes to add to each line
            (``"name"``, ``"funcName"``, ...).

    Example:
        >>> import miniray as ray
        >>> config = ray.LoggingConfig(encoding="JSON", log_level="DEBUG")
        >>> config.to_dict()
        {'encoding': 'JSON', 'log_level': 'DEBUG', 'additional_log_standard_attrs': []}
    """

    encoding: str = "TEXT"
    log_level: str = "INFO"
    additional_log_standard_attrs: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"Invalid encoding type: {self.encoding}. Valid encoding types "
                             f"are: {list(ENCODINGS)}")
        for attr in self.additional_log_standard_attrs:
            if attr not in STANDARD_ATTRS:
                raise ValueError(f"Unknown python logging standard attribute: {attr}. The "
                                 f"valid attributes are: {set(STANDARD_ATTRS)}")

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (what travels to the workers)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> LoggingConfig:
        """A config from ``to_dict()``'s output; unknown keys are ignored, as in Ray."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


LoggingConfig.__module__ = "miniray"


def check_level(level: Any) -> int:
    """The number of ``level``; raises as ``logging`` does for a level it does not know (Ray
    2.60 raises the same ValueError from ``init()``), with what to use instead."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str):
        number = logging.getLevelName(level)
        if isinstance(number, int):
            return number
        raise ValueError(f"Unknown level: {level!r}. Use a level name of the logging module "
                         "in capitals (DEBUG, INFO, WARNING, ERROR, CRITICAL) or a number.")
    raise TypeError(f"Level not an integer or a valid string: {level!r}")


# ----------------------------------------------------------------------------- record fields
def context_fields(rt: Any) -> Dict[str, Any]:
    """The ids a record logged under runtime ``rt`` carries, in Ray's order; {} without one.

    ``rt`` is the driver's ``Runtime`` (``mode == "driver"``) or a worker's ``WorkerRuntime``
    (its ``task`` is the running task or actor call of this thread, its ``actor`` the actor
    it hosts). Values may be None; the filter leaves those out.
    """
    if rt is None:
        return {}
    driver = getattr(rt, "mode", "driver") == "driver"
    info = getattr(rt, "info", None) or {}
    found = {
        "job_id": ids.JOB_ID,
        "worker_id": rt.worker_id,
        "node_id": rt.node_id if driver else info.get("node_id"),
    }
    if driver:
        return found
    actor = getattr(rt, "actor", None)
    task = getattr(rt, "task", None)
    found["actor_id"] = actor.actor_id.hex() if actor is not None else None
    found["task_id"] = task.task_id.hex() if task is not None else None
    found["task_name"] = task.name if task is not None else None
    found["task_func_name"] = task.function_name if task is not None else None
    found["actor_name"] = actor.name if actor is not None else None
    return found


class ContextFilter(logging.Filter):
    """Sets the current driver's, task's or actor's ids on each record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in context_fields(context.current()).items():
            if value is not None and value != "":
                setattr(record, key, value)
        return True


class _FieldsFormatter(logging.Formatter):
    """What both encodings write: the chosen standard attributes, then every attribute that
    is not a standard one (the ids, a user's ``extra=``), then ``timestamp_ns``."""

    def __init__(self, additional_attrs=()) -> None:
        super().__init__()
        self.additional_attrs = list(additional_attrs)

    def record_fields(self, record: logging.LogRecord, with_standard: bool) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if with_standard:
            out["asctime"] = self.formatTime(record)
            out["levelname"] = record.levelname
            out["message"] = record.getMessage()
            out["filename"] = record.filename
            out["lineno"] = record.lineno
            out["process"] = record.process
            if record.exc_info:
                if not record.exc_text:
                    record.exc_text = self.formatException(record.exc_info)
                out["exc_text"] = record.exc_text
        for key in self.additional_attrs:
            out[key] = getattr(record, key, None)
        for key, value in record.__dict__.items():
            if key not in STANDARD_ATTRS:
                out[key] = value
        if _TIMESTAMP_KEY in out:
            out[TIMESTAMP_FIELD] = out.pop(_TIMESTAMP_KEY)
        return out


class JsonFormatter(_FieldsFormatter):
    """One JSON object per record: asctime, levelname, message, filename, lineno, process
    (exc_text with an exception), the additional attributes, the ids, timestamp_ns."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.record_fields(record, with_standard=True), default=str)


class TextFormatter(_FieldsFormatter):
    """Ray's text line: ``<time>\\t<LEVEL> <file>:<line> -- <message>`` (and the traceback),
    then `` key=value`` for the additional attributes, the ids and timestamp_ns."""

    def __init__(self, additional_attrs=()) -> None:
        super().__init__(additional_attrs)
        self.inner = logging.Formatter(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        pairs = " ".join(f"{key}={value}"
                         for key, value in self.record_fields(record, with_standard=False).items())
        return f"{text} {pairs}"


def formatter_for(config: LoggingConfig) -> logging.Formatter:
    cls = JsonFormatter if config.encoding == "JSON" else TextFormatter
    return cls(config.additional_log_standard_attrs)


# ----------------------------------------------------------------------------- applying
_installed: Dict[str, Any] = {}  # the handler configure_process added, and the factory flag


def _install_record_factory() -> None:
    """Records get their creation time in integer nanoseconds (``created`` set from the same
    clock reading), once per process, wrapping whatever factory is in place."""
    if _installed.get("factory"):
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        now = time.time_ns()
        record.created = now / 1e9
        record.__dict__[_TIMESTAMP_KEY] = now
        return record

    logging.setLogRecordFactory(factory)
    _installed["factory"] = True


def configure_process(config: LoggingConfig) -> logging.Handler:
    """Apply ``config`` to this process: a stderr handler on the root logger with the
    config's formatter, level and the ids filter; the root and ``miniray`` loggers at the
    config's level. A handler installed by an earlier call is replaced. Returns the handler.

    Raises:
        ValueError, TypeError: the level is unknown (nothing is changed then).
    """
    level = check_level(config.log_level)
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(formatter_for(config))
    handler.addFilter(ContextFilter())
    _install_record_factory()
    root = logging.getLogger()
    previous = _installed.pop("handler", None)
    if previous is not None:
        root.removeHandler(previous)
    root.setLevel(level)
    root.addHandler(handler)
    logging.getLogger("miniray").setLevel(level)  # as Ray sets its own logger's level
    _installed["handler"] = handler
    return handler
