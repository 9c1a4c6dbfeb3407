"""The pure rules of runtime environments (``_private/core/runtime_envs.py``) and the public
``RuntimeEnv`` / ``RuntimeEnvConfig`` classes. No processes.

Each expectation was compared with Ray 2.60 (``ray.runtime_env``, ``_merge_runtime_env``,
``parse_runtime_env_for_task_or_actor``) run in its own virtualenv.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from miniray._private.core import runtime_envs as r
from miniray._private.core import scheduling
from miniray.runtime_env import RuntimeEnv, RuntimeEnvConfig


def test_merge_is_per_field_except_env_vars():
    """Ray's ``_merge_runtime_env(override=True)``: env_vars per variable, the rest per
    field; neither input is changed."""
    parent = {"env_vars": {"A": "job", "B": "job"}, "working_dir": "/job", "excludes": ["x"]}
    child = {"env_vars": {"B": "task"}, "working_dir": "local:///task"}
    assert r.merge(parent, child) == {
        "working_dir": "local:///task", "excludes": ["x"],
        "env_vars": {"A": "job", "B": "task"}}
    assert parent["env_vars"] == {"A": "job", "B": "job"}
    assert r.merge(None, None) == {}
    assert r.merge({"pip": {"packages": ["a"]}}, {}) == {"pip": {"packages": ["a"]}}


def test_normalize_as_ray_runtime_env():
    """Empty env_vars and pip are dropped, pip becomes a dict, config gets defaults."""
    assert r.normalize({"env_vars": {}, "pip": [], "working_dir": None}) == {}
    assert r.normalize({"pip": ["a", "b", "a"]}) == {
        "pip": {"packages": ["a", "b"], "pip_check": False}}
    assert r.normalize({"config": {"eager_install": False}})["config"] == {
        "setup_timeout_seconds": 600, "eager_install": False, "log_files": []}
    assert r.normalize({"unknown": 1}) == {"unknown": 1}


@pytest.mark.parametrize("env,error,text", [
    ({"env_vars": {"A": 1}}, TypeError,
     "runtime_env['env_vars'] must be of type Dict[str, str], but the value 1 is of type "
     "<class 'int'>"),
    ({"env_vars": {1: "a"}}, TypeError, "but the key 1 is of type <class 'int'>"),
    ({"env_vars": ["a"]}, TypeError, "got <class 'list'>"),
    ({"config": {"setup_timeout_seconds": 0}}, ValueError,
     "setup_timeout_seconds must be greater than zero or equals to -1, got: 0"),
    ({"config": {"setup_timeout_seconds": "5"}}, TypeError,
     "setup_timeout_seconds must be of type int, got: <class 'str'>"),
    ({"config": [1]}, TypeError,
     "runtime_env['config'] must be of type dict or RuntimeEnvConfig, got: <class 'list'>"),
    ({"working_dir": 3}, TypeError, "`working_dir` must be a string, got <class 'int'>."),
    ({"py_modules": "local:///tmp"}, TypeError,
     "`py_modules` must be a list of strings, got <class 'str'>."),
    ({"pip": ["x"], "conda": "y"}, ValueError, "cannot be specified at the same time"),
    ({"container": {"image": "i"}, "working_dir": "local:///x"}, ValueError,
     "The 'container' field currently cannot be used together with other fields"),
    ({"working_dir": "/tmp"}, ValueError,
     "/tmp is not a valid URI. Passing directories or modules to be dynamically uploaded is "
     "only supported at the job level (i.e., passed to `ray.init`)."),
    ({"working_dir": "local://rel/x"}, ValueError,
     'Invalid "local://" runtime_env URI "local://rel/x": the path must be absolute.'),
    ({"worker_process_setup_hook": print}, TypeError, "is not JSON serializable"),
])
def test_parse_for_task_refuses_as_ray(env, error, text):
    with pytest.raises(error) as caught:
        r.parse_for_task(env)
    assert text in str(caught.value)


def test_parse_for_task_accepts_uris_and_empty():
    assert r.parse_for_task(None) is None
    assert r.parse_for_task({}) is None
    assert r.parse_for_task({"env_vars": {}}) == {}
    env = {"working_dir": "local:///srv", "py_modules": ["local:///lib", "s3://b/m.zip"]}
    assert r.parse_for_task(env) == env
    with pytest.raises(TypeError, match="runtime_env must be dict or RuntimeEnv"):
        r.parse_for_task("abc")


def test_parse_for_job_takes_paths_modules_and_callables(tmp_path):
    """init() takes local paths (made absolute), Paths, imported modules and a callable
    hook, which the environment names by ``__name__`` (as Ray reports it)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "one.py").write_text("")
    module = types.ModuleType("one")
    module.__file__ = str(tmp_path / "one.py")

    def my_hook():
        pass

    env, hook = r.parse_for_job({"working_dir": tmp_path, "py_modules": [
        tmp_path / "pkg", module], "worker_process_setup_hook": my_hook})
    assert env == {"working_dir": str(tmp_path),
                   "py_modules": [str(tmp_path / "pkg"), str(tmp_path / "one.py")],
                   "worker_process_setup_hook": "my_hook"}
    assert hook is my_hook
    with pytest.raises(ValueError, match="must be an existing directory or a supported"):
        r.parse_for_job({"working_dir": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="must be an existing directory or a supported"):
        r.parse_for_job({"working_dir": str(tmp_path / "missing.zip")})  # Ray: must exist
    (tmp_path / "app.zip").write_bytes(b"")
    assert r.parse_for_job({"working_dir": str(tmp_path / "app.zip")})[0] == {
        "working_dir": str(tmp_path / "app.zip")}  # accepted; its tasks cannot be set up
    with pytest.raises(ValueError, match="py_modules entry must be a .py file, a directory"):
        r.parse_for_job({"py_modules": [str(tmp_path / "x.txt")]})
    with pytest.raises(TypeError, match="worker_process_setup_hook must be a function"):
        r.parse_for_job({"worker_process_setup_hook": 3})
    assert r.parse_for_job(None) == ({}, None)


def test_env_key_is_canonical():
    assert r.env_key({}) == ""
    a = r.env_key({"env_vars": {"B": "2", "A": "1"}, "working_dir": "local:///x"})
    b = r.env_key({"working_dir": "local:///x", "env_vars": {"A": "1", "B": "2"}})
    assert a == b
    assert r.from_key(a) == {"env_vars": {"A": "1", "B": "2"}, "working_dir": "local:///x"}


def test_string_of_matches_rays_two_forms():
    """Ray prints the job's environment with json.dumps defaults, a task's own compactly."""
    env = {"env_vars": {"B": "x", "A": "y"}}
    assert r.string_of({}, job=True) == "{}"
    assert r.string_of(env, job=True) == '{"env_vars": {"A": "y", "B": "x"}}'
    assert r.string_of(env, job=False) == '{"env_vars":{"A":"y","B":"x"}}'


class _Runtime:
    def __init__(self, job, own=None):
        self.job_runtime_env = job
        self.runtime_env = job if own is None else own
        self.runtime_env_key = "" if own is None else r.env_key(own)


def test_submission_key_merges_over_the_parent():
    job = {"env_vars": {"A": "job"}}
    driver = _Runtime(job)
    assert r.submission_key(driver, None) == ""
    assert r.submission_key(driver, {"env_vars": {"A": "job"}}) == ""  # the job's own
    key = r.submission_key(driver, {"env_vars": {"B": "task"}})
    assert json.loads(key) == {"env_vars": {"A": "job", "B": "task"}}
    worker = _Runtime(job, own=json.loads(key))
    assert r.submission_key(worker, None) == key  # a nested task inherits its parent's
    nested = json.loads(r.submission_key(worker, {"env_vars": {"C": "child"}}))
    assert nested == {"env_vars": {"A": "job", "B": "task", "C": "child"}}


def test_setup_error_names_each_field_and_what_to_do(tmp_path):
    assert r.setup_error({"env_vars": {"A": "1"}, "working_dir": str(tmp_path)}) is None
    assert r.setup_error({"py_executable": sys.executable}) is None
    text = r.setup_error({"pip": {"packages": ["requests"]}, "conda": "x"})
    assert "'pip'" in text and "'conda'" in text and sys.prefix in text
    assert "run the program on Ray" in text
    assert "py_executable" in r.setup_error({"py_executable": "/usr/bin/nonexistent-python"})
    assert "working_dir" in r.setup_error({"working_dir": "s3://bucket/app.zip"})
    assert "working_dir" in r.setup_error({"working_dir": f"local://{tmp_path}/none"})
    assert "py_modules" in r.setup_error({"py_modules": [str(tmp_path / "w.whl")]})
    assert r.setup_error({"py_modules": [f"local://{tmp_path}"]}) is None


def test_unknown_fields():
    assert r.unknown_fields({"env_vars": {}, "pip": 1, "nsight": 1, "zzz": 1}) == ["zzz"]


def test_scheduling_key_separates_environments():
    assert scheduling.scheduling_key({"CPU": 1}, 0) == scheduling.scheduling_key({"CPU": 1}, 0, "")
    assert scheduling.scheduling_key({"CPU": 1}, 0, '{"env_vars":{"A":"1"}}') != \
        scheduling.scheduling_key({"CPU": 1}, 0)


def test_runtime_env_class_as_rays():
    """RuntimeEnv validates on construction, maps nsight to _nsight, turns config into a
    RuntimeEnvConfig, and round-trips through serialize/deserialize."""
    assert RuntimeEnv(env_vars={}) == {}
    assert RuntimeEnv(pip=["a"]) == {"pip": {"packages": ["a"], "pip_check": False}}
    assert RuntimeEnv(nsight="default") == {"_nsight": "default"}
    env = RuntimeEnv(config={"eager_install": False}, env_vars={"A": "1"})
    assert isinstance(env["config"], RuntimeEnvConfig)
    assert env.env_vars() == {"A": "1"} and env.working_dir() == ""
    assert RuntimeEnv.deserialize(env.serialize()) == env
    assert env.to_dict()["config"] == {"setup_timeout_seconds": 600, "eager_install": False,
                                       "log_files": []}
    with pytest.raises(TypeError, match="but the value 1 is of type"):
        RuntimeEnv(env_vars={"A": 1})
    assert RuntimeEnv(_validate=False, env_vars={"A": 1}) == {"env_vars": {"A": 1}}
    env["env_vars"] = {}
    assert env["env_vars"] == {"A": "1"}  # Ray ignores a value that normalises to nothing
    assert RuntimeEnv(zzz=1).plugins() == [("zzz", 1)]


def test_runtime_env_config_as_rays():
    assert RuntimeEnvConfig() == {"setup_timeout_seconds": 600, "eager_install": True,
                                  "log_files": []}
    assert RuntimeEnvConfig(setup_timeout_seconds=-1)["setup_timeout_seconds"] == -1
    with pytest.raises(ValueError, match="greater than zero"):
        RuntimeEnvConfig(setup_timeout_seconds=-5)
    with pytest.raises(TypeError, match="Each item in log_files must be a string."):
        RuntimeEnvConfig(log_files=[1])
    parsed = RuntimeEnvConfig.parse_and_validate_runtime_env_config({"eager_install": False})
    assert parsed["eager_install"] is False


class _Conn:
    def __init__(self, fd):
        self.fd = fd
        self.closed = False

    def fileno(self):
        return self.fd

    def close(self):
        self.closed = True


class _Reactor:
    def unregister(self, fd):
        pass


def _pool(max_workers: int, envs: list):
    from miniray._private.owner.workers import WorkerPool, WorkerSlot

    pool = WorkerPool(reactor=_Reactor(), log_to_driver=False, prefix_enabled=False,
                      max_workers=max_workers, idle_keep=8, on_data=None, on_output=None)
    for fd, env in enumerate(envs):
        worker = WorkerSlot(_Conn(fd), _Conn(100 + fd), fd)
        worker.runtime_env = env
        pool.idle.append(worker)
        pool.live += 1
    return pool


def test_idle_workers_are_reused_only_in_their_environment():
    """A worker serves one runtime environment (as Ray keeps a worker per runtime_env): an
    idle worker of another one is never handed out; it retires only when the cap needs
    its place."""
    cpu = {"CPU": 1}
    pool = _pool(8, ["", "A", ""])
    assert pool.take_idle(cpu, "A").runtime_env == "A"
    assert pool.take_idle(cpu, "").conn.fd == 2  # the most recent of its environment
    assert pool.take_idle(cpu, "B") is None
    assert [w.conn.fd for w in pool.idle] == [0] and not pool.idle[0].dead  # under the cap
    assert pool.room(0, cpu, "B") == 8 - 3  # no idle worker of B: only new ones count
    full = _pool(2, ["A", ""])
    assert full.room(0, cpu, "B") == 0  # at the cap: one must retire for a worker of B
    full.retire_one_idle(cpu, "")  # none serves B: the oldest goes
    assert [w.runtime_env for w in full.idle] == [""]
    full = _pool(2, ["", "A"])
    full.retire_one_idle(cpu, "")  # one of another environment goes first
    assert [w.runtime_env for w in full.idle] == [""]


# Ray 2.60's RuntimeContext: each public member, and whether it is a property.
_RAY_CONTEXT_MEMBERS = {
    "actor_id": True, "current_actor": True, "current_placement_group_id": True,
    "gcs_address": True, "get": False, "get_accelerator_ids": False, "get_actor_id": False,
    "get_actor_name": False, "get_assigned_resources": False, "get_job_id": False,
    "get_node_id": False, "get_node_labels": False, "get_placement_group_id": False,
    "get_resource_ids": False, "get_runtime_env_string": False, "get_session_name": False,
    "get_task_function_name": False, "get_task_id": False, "get_task_name": False,
    "get_temp_dir": False, "get_worker_id": False, "is_canceled": False, "job_id": True,
    "namespace": True, "node_id": True, "runtime_env": True,
    "should_capture_child_tasks_in_placement_group": True, "task_id": True,
    "was_current_actor_reconstructed": True,
}


def test_runtime_context_has_every_member_of_rays():
    """The public members of RuntimeContext are Ray 2.60's, properties where Ray's are."""
    import inspect

    from miniray.runtime_context import RuntimeContext

    members = {name: isinstance(inspect.getattr_static(RuntimeContext, name), property)
               for name in dir(RuntimeContext) if not name.startswith("_")}
    assert members == _RAY_CONTEXT_MEMBERS


def test_id_objects():
    from miniray._private.core import ids

    job = ids.JobID.from_hex("01000000")
    assert repr(job) == "JobID(01000000)" and job.hex() == "01000000"
    assert job == ids.JobID(b"\x01\x00\x00\x00") and hash(job) == hash(ids.JobID.from_hex(
        "01000000"))
    assert ids.PlacementGroupID.nil().is_nil() and not job.is_nil()
    with pytest.raises(ValueError, match="needs to have length 4"):  # Ray's wording
        ids.JobID(b"\x01")
    import pickle

    assert pickle.loads(pickle.dumps(job)) == job
