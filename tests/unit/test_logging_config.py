"""LoggingConfig: its checks, to_dict/from_dict, the record fields and both formatters.

Compared with Ray 2.60 (``ray.LoggingConfig`` in its own virtualenv): the messages of the
ValueErrors, the defaults, ``from_dict`` ignoring unknown keys, an unknown level accepted at
construction and refused by ``init()``, the order of the JSON keys and the TEXT line's shape.
No process is started here.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest

import miniray
from miniray._private import runtime
from miniray._private.core import context, logging_config
from miniray._private.core.logging_config import (
    ContextFilter,
    JsonFormatter,
    LoggingConfig,
    TextFormatter,
    check_level,
    context_fields,
)


# ----------------------------------------------------------------------------- the config
def test_defaults_and_to_dict():
    config = LoggingConfig()
    assert config.to_dict() == {"encoding": "TEXT", "log_level": "INFO",
                                "additional_log_standard_attrs": []}
    assert repr(config) == ("LoggingConfig(encoding='TEXT', log_level='INFO', "
                            "additional_log_standard_attrs=[])")
    assert config == LoggingConfig(encoding="TEXT")
    assert LoggingConfig().additional_log_standard_attrs is not config.additional_log_standard_attrs


def test_from_dict_round_trips_and_ignores_unknown_keys():
    config = LoggingConfig(encoding="JSON", log_level="DEBUG",
                           additional_log_standard_attrs=["name", "funcName"])
    assert LoggingConfig.from_dict(config.to_dict()) == config
    assert LoggingConfig.from_dict({"encoding": "JSON", "colour": "red"}) == LoggingConfig(
        encoding="JSON")


@pytest.mark.parametrize("encoding", ["XML", "json", None])
def test_an_unknown_encoding_is_refused_with_rays_message(encoding):
    with pytest.raises(ValueError) as info:
        LoggingConfig(encoding=encoding)
    assert str(info.value) == (f"Invalid encoding type: {encoding}. Valid encoding types are: "
                               "['TEXT', 'JSON']")


def test_an_unknown_standard_attribute_is_refused_with_rays_message():
    with pytest.raises(ValueError) as info:
        LoggingConfig(additional_log_standard_attrs=["name", "nope"])
    text = str(info.value)
    assert text.startswith("Unknown python logging standard attribute: nope. The valid "
                           "attributes are: {")
    for attr in ("name", "funcName", "thread", "taskName", "relativeCreated"):
        assert repr(attr) in text


def test_any_level_is_accepted_at_construction_and_checked_by_init():
    assert LoggingConfig(log_level="BOGUS").log_level == "BOGUS"  # as in Ray
    assert check_level("DEBUG") == logging.DEBUG
    assert check_level(15) == 15
    with pytest.raises(ValueError, match=r"^Unknown level: 'BOGUS'\. Use a level name"):
        check_level("BOGUS")
    with pytest.raises(ValueError, match=r"^Unknown level: 'warning'"):
        check_level("warning")  # names are capitals, as logging (and Ray) require
    with pytest.raises(TypeError, match="Level not an integer or a valid string: None"):
        check_level(None)


def test_init_checks_the_config_before_starting_anything(monkeypatch):
    monkeypatch.delenv("RAY_LOGGING_CONFIG_ENCODING", raising=False)
    assert runtime.job_logging_config(None) is None
    config = LoggingConfig(encoding="JSON")
    assert runtime.job_logging_config(config) is config
    with pytest.raises(ValueError, match="Unknown level: 'BOGUS'"):
        runtime.job_logging_config(LoggingConfig(log_level="BOGUS"))
    with pytest.raises(TypeError, match="logging_config must be a ray.LoggingConfig"):
        runtime.job_logging_config({"encoding": "JSON"})


def test_the_environment_variable_names_a_default_config(monkeypatch):
    """Ray 2.60 applies ``LoggingConfig(encoding=RAY_LOGGING_CONFIG_ENCODING)`` when init()
    is given none."""
    monkeypatch.setenv("RAY_LOGGING_CONFIG_ENCODING", "JSON")
    assert runtime.job_logging_config(None) == LoggingConfig(encoding="JSON")
    given = LoggingConfig(encoding="TEXT")
    assert runtime.job_logging_config(given) is given
    monkeypatch.setenv("RAY_LOGGING_CONFIG_ENCODING", "XML")
    with pytest.raises(ValueError, match="Invalid encoding type: XML"):
        runtime.job_logging_config(None)


def test_it_is_exported_at_the_top_level():
    assert "LoggingConfig" in miniray.__all__
    assert miniray.LoggingConfig is LoggingConfig
    assert LoggingConfig.__module__ == "miniray"


# ----------------------------------------------------------------------------- record fields
class _Driver:
    mode = "driver"
    worker_id = "w" * 56
    node_id = "n" * 56


class _Task:
    def __init__(self, name, function_name):
        self.task_id = bytes.fromhex("ab" * 24)
        self.name = name
        self.function_name = function_name


class _Actor:
    def __init__(self, name):
        self.actor_id = bytes.fromhex("cd" * 16)
        self.name = name


class _Worker:
    mode = "worker"
    worker_id = "v" * 56

    def __init__(self, task=None, actor=None):
        self.info = {"node_id": "m" * 56}
        self.task = task
        self.actor = actor


def test_context_fields_of_a_driver_a_task_and_an_actor_call():
    assert context_fields(None) == {}
    assert context_fields(_Driver()) == {"job_id": "01000000", "worker_id": "w" * 56,
                                         "node_id": "n" * 56}
    task = context_fields(_Worker(task=_Task("f", "app.f")))
    assert list(task) == ["job_id", "worker_id", "node_id", "actor_id", "task_id", "task_name",
                          "task_func_name", "actor_name"]  # Ray's order
    assert task["task_id"] == "ab" * 24 and task["task_name"] == "f"
    assert task["task_func_name"] == "app.f" and task["actor_id"] is None
    call = context_fields(_Worker(task=_Task("A.m", "app.A.m"), actor=_Actor("counter")))
    assert call["actor_id"] == "cd" * 16 and call["actor_name"] == "counter"
    idle = context_fields(_Worker())
    assert idle["task_id"] is None and idle["node_id"] == "m" * 56


def _record(msg="hello %s", args=("world",), exc_info=None, extra=None):
    record = logging.LogRecord("app.part", logging.WARNING, "/src/app.py", 42, msg, args,
                               exc_info, func="work")
    record.created = 1795486324.5
    record.msecs = 500.0
    record.process = 4321
    record.__dict__["_miniray_timestamp_ns"] = 1795486324500000000
    for key, value in (extra or {}).items():
        setattr(record, key, value)
    return record


def _filtered(record, rt, monkeypatch):
    monkeypatch.setattr(context, "_current", rt)
    assert ContextFilter().filter(record) is True
    return record


def test_the_filter_sets_the_ids_and_leaves_out_empty_ones(monkeypatch):
    record = _filtered(_record(), _Worker(task=_Task("f", "app.f"), actor=None), monkeypatch)
    assert record.task_name == "f" and record.job_id == "01000000"
    assert not hasattr(record, "actor_id") and not hasattr(record, "actor_name")
    record = _filtered(_record(), _Worker(task=_Task("A.m", "app.A.m"), actor=_Actor("")),
                       monkeypatch)
    assert record.actor_id == "cd" * 16 and not hasattr(record, "actor_name")
    record = _filtered(_record(), None, monkeypatch)  # not initialized: nothing added
    assert not hasattr(record, "job_id")


def test_json_lines_carry_rays_keys_in_rays_order(monkeypatch):
    record = _filtered(_record(extra={"user_key": {"a": 1}}),
                       _Worker(task=_Task("f", "app.f")), monkeypatch)
    formatter = JsonFormatter(["name", "funcName"])
    line = formatter.format(record)
    data = json.loads(line)
    assert list(data) == ["asctime", "levelname", "message", "filename", "lineno", "process",
                          "name", "funcName", "user_key", "job_id", "worker_id", "node_id",
                          "task_id", "task_name", "task_func_name", "timestamp_ns"]
    assert data["asctime"] == formatter.formatTime(record)
    assert data["asctime"].endswith(",500")
    assert (data["levelname"], data["message"], data["filename"], data["lineno"]) == (
        "WARNING", "hello world", "app.py", 42)
    assert (data["process"], data["name"], data["funcName"]) == (4321, "app.part", "work")
    assert data["user_key"] == {"a": 1}
    assert data["timestamp_ns"] == 1795486324500000000
    assert "\n" not in line


def test_json_lines_hold_the_traceback_and_any_value(monkeypatch):
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        exc_info = sys.exc_info()
    record = _filtered(_record(exc_info=exc_info, extra={"thing": object()}), _Driver(),
                       monkeypatch)
    data = json.loads(JsonFormatter().format(record))
    assert list(data)[:7] == ["asctime", "levelname", "message", "filename", "lineno",
                              "process", "exc_text"]
    assert data["exc_text"].startswith("Traceback (most recent call last):")
    assert data["exc_text"].endswith("ZeroDivisionError: division by zero")
    assert data["thing"].startswith("<object object at")  # str() rather than a failed line
    assert "task_id" not in data  # a driver's records carry no task


def test_text_lines_have_rays_shape(monkeypatch):
    record = _filtered(_record(), _Worker(task=_Task("f", "app.f")), monkeypatch)
    formatter = TextFormatter(["name"])
    line = formatter.format(record)
    asctime = formatter.formatTime(record)
    assert line == (
        f"{asctime}\tWARNING app.py:42 -- hello world name=app.part job_id=01000000 "
        f"worker_id={'v' * 56} node_id={'m' * 56} task_id={'ab' * 24} task_name=f "
        "task_func_name=app.f timestamp_ns=1795486324500000000")


def test_text_lines_put_the_traceback_before_the_fields(monkeypatch):
    try:
        raise KeyError("k")
    except KeyError:
        exc_info = sys.exc_info()
    record = _filtered(_record(exc_info=exc_info), _Driver(), monkeypatch)
    lines = TextFormatter().format(record).split("\n")
    assert lines[0].endswith("\tWARNING app.py:42 -- hello world")
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1].startswith("KeyError: 'k' job_id=01000000 worker_id=")
    assert lines[-1].endswith(" timestamp_ns=1795486324500000000")


# ----------------------------------------------------------------------------- applying
@pytest.fixture
def clean_logging():
    """Puts the logging module back as it was (root handlers and level, the record factory,
    the miniray logger's level)."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogRecordFactory(),
             logging.getLogger("miniray").level, dict(logging_config._installed))
    yield
    handlers, level, factory, miniray_level, installed = saved
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.setLogRecordFactory(factory)
    logging.getLogger("miniray").setLevel(miniray_level)
    logging_config._installed.clear()
    logging_config._installed.update(installed)


def test_configure_process_sets_one_handler_and_the_levels(clean_logging, capsys,
                                                           monkeypatch):
    monkeypatch.setattr(context, "_current", _Driver())
    root = logging.getLogger()
    before = len(root.handlers)
    first = logging_config.configure_process(LoggingConfig(encoding="TEXT", log_level="DEBUG"))
    second = logging_config.configure_process(LoggingConfig(encoding="JSON",
                                                            log_level="WARNING"))
    assert first not in root.handlers and second in root.handlers  # replaced, not added
    assert len(root.handlers) == before + 1
    assert root.level == logging.WARNING
    assert logging.getLogger("miniray").level == logging.WARNING
    logging.getLogger("app").warning("seen %d", 1)
    logging.getLogger("app").info("not seen")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    data = json.loads(err[0])
    assert data["message"] == "seen 1" and data["worker_id"] == "w" * 56
    assert isinstance(data["timestamp_ns"], int)
    assert abs(data["timestamp_ns"] / 1e9 - logging.makeLogRecord({}).created) < 60


def test_configure_process_with_an_unknown_level_changes_nothing(clean_logging):
    root = logging.getLogger()
    handlers = list(root.handlers)
    with pytest.raises(ValueError, match="Unknown level"):
        logging_config.configure_process(LoggingConfig(log_level="LOUD"))
    assert root.handlers == handlers
