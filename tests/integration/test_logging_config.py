"""``init(logging_config=LoggingConfig(...))``: the driver's and every worker's log lines.

Compared with Ray 2.60 (the same driver run with Ray's interpreter): records go to stderr, one
JSON object or one TEXT line each, with ``job_id``, ``worker_id``, ``node_id``, and in a task
``task_id``, ``task_name`` (the function's name or ``.options(name=...)``) and
``task_func_name`` (``<script stem>.f``), in an actor also ``actor_id`` and, for a named
actor, ``actor_name``; the constructor's task is ``A.__init__`` (``name:A.__init__`` for a
named actor). The root logger of a worker is at the config's level. While a config is set,
worker lines reach the driver without the ``(name pid=N)`` prefix, prints included. Each
test runs its own driver process, so the real stdout and stderr are checked.
"""

from __future__ import annotations

import json
import re

import pytest

DRIVER = """
    import json, logging, os, sys
    import miniray as ray

    config = json.loads(sys.argv[1])
    ray.init(num_cpus=2, **({"logging_config": ray.LoggingConfig(**config)}
                            if config is not None else {}))
    log = logging.getLogger("app")
    log.warning("from the driver")

    @ray.remote
    def f():
        logging.getLogger("app").warning("from a task")
        logging.getLogger().debug("debug from a task")
        print("printed by a task")
        return os.getpid(), logging.getLogger().level, ray.get_runtime_context().get_worker_id()

    @ray.remote
    class A:
        def __init__(self):
            logging.getLogger("app").warning("from a constructor")

        def m(self):
            logging.getLogger("app").warning("from an actor method")
            c = ray.get_runtime_context()
            return os.getpid(), c.get_actor_id(), c.get_worker_id()

    pid, level, worker_id = ray.get(f.remote(), timeout=60)
    ray.get(f.options(name="custom").remote(), timeout=60)
    named = A.options(name="counter").remote()
    named_pid, named_actor_id, named_worker_id = ray.get(named.m.remote(), timeout=60)
    anon_pid, anon_actor_id, _ = ray.get(A.remote().m.remote(), timeout=60)
    facts = dict(pid=pid, level=level, worker_id=worker_id, named_pid=named_pid,
                 named_actor_id=named_actor_id, named_worker_id=named_worker_id,
                 anon_pid=anon_pid, anon_actor_id=anon_actor_id, driver_pid=os.getpid(),
                 node_id=ray.get_runtime_context().get_node_id(),
                 driver_worker_id=ray.get_runtime_context().get_worker_id())
    print("FACTS " + json.dumps(facts), flush=True)
    ray.shutdown()
"""


def _run(drivers, config, **env):
    result = drivers.run(DRIVER, timeout=90, args=[json.dumps(config)], **env)
    assert result.returncode == 0, result.stderr
    facts = [line for line in result.stdout.splitlines() if line.startswith("FACTS ")]
    assert facts, result.stdout + result.stderr
    return result, json.loads(facts[0][6:])


def _json_records(stderr: str) -> dict:
    """The JSON records of stderr by message (the last one of each message)."""
    records = {}
    for line in stderr.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            records[data["message"]] = data
    return records


def test_json_lines_of_the_driver_a_task_and_an_actor(drivers):
    result, facts = _run(drivers, {"encoding": "JSON", "log_level": "DEBUG"})
    records = _json_records(result.stderr)
    node_id = facts["node_id"]

    driver = records["from the driver"]
    assert list(driver) == ["asctime", "levelname", "message", "filename", "lineno", "process",
                            "job_id", "worker_id", "node_id", "timestamp_ns"]
    assert driver["levelname"] == "WARNING" and driver["process"] == facts["driver_pid"]
    assert driver["filename"].startswith("driver_") and driver["lineno"] == 9
    assert driver["job_id"] == "01000000" and driver["node_id"] == node_id
    assert driver["worker_id"] == facts["driver_worker_id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", driver["asctime"])
    assert isinstance(driver["timestamp_ns"], int)

    task = [json.loads(line) for line in result.stderr.splitlines()
            if line.startswith('{"') and '"from a task"' in line]
    assert [r["task_name"] for r in task] == ["f", "custom"]
    first = task[0]
    assert list(first) == ["asctime", "levelname", "message", "filename", "lineno", "process",
                           "job_id", "worker_id", "node_id", "task_id", "task_name",
                           "task_func_name", "timestamp_ns"]
    assert first["process"] == facts["pid"] and first["worker_id"] == facts["worker_id"]
    assert first["node_id"] == node_id and len(first["task_id"]) == 48
    assert first["task_func_name"].startswith("driver_") and first["task_func_name"].endswith(
        ".f")
    assert task[0]["task_id"] != task[1]["task_id"]
    # The worker's root logger is at the config's level.
    assert facts["level"] == 10
    assert records["debug from a task"]["levelname"] == "DEBUG"

    method = [json.loads(line) for line in result.stderr.splitlines()
              if '"from an actor method"' in line]
    named = next(r for r in method if r["process"] == facts["named_pid"])
    assert list(named) == ["asctime", "levelname", "message", "filename", "lineno", "process",
                           "job_id", "worker_id", "node_id", "actor_id", "task_id",
                           "task_name", "task_func_name", "actor_name", "timestamp_ns"]
    assert named["actor_id"] == facts["named_actor_id"] and named["actor_name"] == "counter"
    assert named["worker_id"] == facts["named_worker_id"]
    assert named["task_name"] == "A.m" and named["task_func_name"].endswith(".A.m")
    assert named["task_id"].endswith(facts["named_actor_id"])
    anonymous = next(r for r in method if r["process"] == facts["anon_pid"])
    assert anonymous["actor_id"] == facts["anon_actor_id"] and "actor_name" not in anonymous

    constructors = {record["process"]: record for record in map(json.loads, (
        line for line in result.stderr.splitlines() if '"from a constructor"' in line))}
    named_init = constructors[facts["named_pid"]]
    assert named_init["task_name"] == "counter:A.__init__"
    assert named_init["task_id"] == "f" * 16 + facts["named_actor_id"]
    assert named_init["task_func_name"].endswith(".A.__init__")
    assert constructors[facts["anon_pid"]]["task_name"] == "A.__init__"

    # No "(f pid=N)" prefix while a config is set, on either stream (as Ray).
    assert "printed by a task" in result.stdout.splitlines()
    assert "pid=" not in result.stdout and "pid=" not in result.stderr


TEXT_LINE = re.compile(
    r"(?P<asctime>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\t(?P<level>[A-Z]+) "
    r"(?P<file>[\w.]+):(?P<line>\d+) -- (?P<message>.*?) (?P<pairs>\w+=.*)")


def _text_records(stderr: str) -> dict:
    records = {}
    for line in stderr.splitlines():
        match = TEXT_LINE.fullmatch(line)
        if match:
            pairs = dict(pair.split("=", 1) for pair in match["pairs"].split(" "))
            records.setdefault(match["message"], []).append((match, pairs))
    return records


def test_text_lines_with_additional_attributes(drivers):
    result, facts = _run(drivers, {"encoding": "TEXT", "log_level": "INFO",
                                   "additional_log_standard_attrs": ["name", "funcName"]})
    records = _text_records(result.stderr)
    [(driver, pairs)] = records["from the driver"]
    assert driver["level"] == "WARNING" and driver["line"] == "9"
    assert list(pairs) == ["name", "funcName", "job_id", "worker_id", "node_id",
                           "timestamp_ns"]
    assert pairs["name"] == "app" and pairs["funcName"] == "<module>"
    assert pairs["node_id"] == facts["node_id"] and pairs["timestamp_ns"].isdigit()

    (task, task_pairs), (_, custom_pairs) = records["from a task"]
    assert list(task_pairs) == ["name", "funcName", "job_id", "worker_id", "node_id",
                                "task_id", "task_name", "task_func_name", "timestamp_ns"]
    assert task_pairs["funcName"] == "f" and task_pairs["task_name"] == "f"
    assert task_pairs["worker_id"] == facts["worker_id"]
    assert custom_pairs["task_name"] == "custom"
    assert "debug from a task" not in result.stderr  # INFO: the worker's root drops DEBUG
    assert facts["level"] == 20

    methods = {pairs["actor_id"]: pairs for _, pairs in records["from an actor method"]}
    named = methods[facts["named_actor_id"]]
    assert named["actor_name"] == "counter" and named["task_name"] == "A.m"
    assert named["funcName"] == "m"
    assert "actor_name" not in methods[facts["anon_actor_id"]]
    assert "printed by a task" in result.stdout.splitlines()
    assert "pid=" not in result.stdout


def test_the_environment_variable_applies_a_default_config(drivers):
    """``RAY_LOGGING_CONFIG_ENCODING=JSON`` with no ``logging_config`` (Ray 2.60 applies
    ``LoggingConfig(encoding="JSON")``: level INFO)."""
    result, facts = _run(drivers, None, RAY_LOGGING_CONFIG_ENCODING="JSON")
    records = _json_records(result.stderr)
    assert records["from a task"]["task_name"] == "custom"
    assert records["from the driver"]["worker_id"] == facts["driver_worker_id"]
    assert "debug from a task" not in records


def test_without_a_config_nothing_changes(drivers):
    """No config: worker lines keep their prefix and log records are not reformatted."""
    result, facts = _run(drivers, None)
    assert f"(f pid={facts['pid']}) printed by a task" in result.stdout.splitlines()
    assert "job_id" not in result.stderr and "timestamp_ns" not in result.stderr
    assert facts["level"] == 30  # the logging module's default, untouched
    assert not any(line.startswith("{") for line in result.stderr.splitlines())


def test_an_unknown_level_fails_init_before_anything_starts(session_root):
    """Ray 2.60: ``ValueError: Unknown level: 'BOGUS'`` from ``init()``."""
    import logging
    import os

    import miniray

    handlers = list(logging.getLogger().handlers)
    with pytest.raises(ValueError, match="Unknown level: 'BOGUS'"):
        miniray.init(num_cpus=1, logging_config=miniray.LoggingConfig(log_level="BOGUS"))
    assert not miniray.is_initialized()
    assert logging.getLogger().handlers == handlers
    assert not os.path.isdir(session_root) or not [
        name for name in os.listdir(session_root) if name.startswith("session_")]


def test_a_config_that_is_not_a_logging_config_is_refused(session_root):
    import miniray

    with pytest.raises(TypeError, match="logging_config must be a ray.LoggingConfig"):
        miniray.init(num_cpus=1, logging_config={"encoding": "JSON"})
    assert not miniray.is_initialized()


def test_concurrent_actor_calls_each_carry_their_own_task(drivers):
    """Calls running at the same time in an async actor and in a threaded one each log their
    own task id (compared with Ray 2.60: one task id per call)."""
    result = drivers.run("""
        import asyncio, logging, time
        import miniray as ray

        ray.init(num_cpus=2, logging_config=ray.LoggingConfig(encoding="JSON"))

        @ray.remote
        class Async:
            async def m(self, i):
                await asyncio.sleep(0.2)
                logging.getLogger("a").warning("async %d", i)
                return ray.get_runtime_context().get_task_id()

        @ray.remote(max_concurrency=3)
        class Threaded:
            def m(self, i):
                time.sleep(0.2)
                logging.getLogger("a").warning("thread %d", i)
                return ray.get_runtime_context().get_task_id()

        a, t = Async.remote(), Threaded.remote()
        ids = ray.get([a.m.remote(i) for i in range(3)] + [t.m.remote(i) for i in range(3)],
                      timeout=60)
        print("IDS " + " ".join(ids), flush=True)
        ray.shutdown()
    """, timeout=90)
    assert result.returncode == 0, result.stderr
    [ids_line] = [line for line in result.stdout.splitlines() if line.startswith("IDS ")]
    expected = ids_line.split()[1:]
    records = _json_records(result.stderr)
    logged = [records[f"async {i}"]["task_id"] for i in range(3)]
    logged += [records[f"thread {i}"]["task_id"] for i in range(3)]
    assert logged == expected and len(set(logged)) == 6


def test_a_job_configs_logging_config_reaches_the_workers_only(drivers):
    """``JobConfig.set_py_logging_config`` with no ``logging_config``: Ray 2.60 applies it in
    the workers (JSON lines, no prefix) and leaves the driver's logging alone."""
    result = drivers.run("""
        import logging
        import miniray as ray
        from miniray.job_config import JobConfig

        job = JobConfig()
        job.set_py_logging_config(ray.LoggingConfig(encoding="JSON"))
        ray.init(num_cpus=1, job_config=job)
        logging.getLogger("x").warning("driver line")

        @ray.remote
        def f():
            logging.getLogger("x").warning("task line")
            print("task print")

        ray.get(f.remote(), timeout=60)
        ray.shutdown()
    """, timeout=90)
    assert result.returncode == 0, result.stderr
    records = _json_records(result.stderr)
    assert records["task line"]["task_name"] == "f"
    assert "driver line" in result.stderr.splitlines()  # the logging module's last resort
    assert "driver line" not in records
    assert "task print" in result.stdout.splitlines()
