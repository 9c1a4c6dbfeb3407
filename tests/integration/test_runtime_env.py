"""runtime_env applied or refused, per job, task and actor, and what RuntimeContext reports.

Every behaviour here was compared side by side with Ray 2.60 (``ray.init(num_cpus=2)`` in its
own virtualenv); where miniray differs on purpose, the test says so.
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from miniray.exceptions import (
    ActorDiedError,
    RayTaskError,
    RuntimeEnvSetupError,
    WorkerCrashedError,
)
from miniray.runtime_env import RuntimeEnv
from miniray.util.annotations import RayDeprecationWarning


def _env(*names):
    return tuple(os.environ.get(name) for name in names)


def _write(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return str(path)


# --------------------------------------------------------------------------- env_vars


def test_task_env_vars_merge_over_the_job_and_stay_with_their_worker(ray_start):
    """env_vars are merged variable by variable over init()'s; a later plain task does not
    see them (Ray 2.60 runs it in another worker: pids differ, as here)."""
    import miniray as ray

    ray_start(num_cpus=2, runtime_env={"env_vars": {"A": "job", "B": "job"}})

    @ray.remote
    def probe():
        return _env("A", "B", "C") + (os.getpid(),)

    plain = ray.get(probe.remote(), timeout=60)
    own = ray.get(probe.options(runtime_env={"env_vars": {"B": "task", "C": "task"}}).remote(),
                  timeout=60)
    again = ray.get(probe.remote(), timeout=60)
    assert plain[:3] == ("job", "job", None)
    assert own[:3] == ("job", "task", "task")
    assert again[:3] == ("job", "job", None)
    assert own[3] not in (plain[3], again[3])


def test_env_vars_expand_references_as_ray_does(ray_start, monkeypatch):
    """``${NAME}`` in an env_vars value is NAME's value in the worker's environment, "" when
    unset: a job's is expanded once (not again when merged into a task's), a task's sees the
    job's already expanded. The same script under Ray 2.60 printed ('/base:/extra', ':/x')
    then ('/base:/extra', '/base:/extra-t'); miniray set the text as given."""
    import miniray as ray

    monkeypatch.setenv("MYPATH", "/base")
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    ray_start(num_cpus=1, runtime_env={"env_vars": {"MYPATH": "${MYPATH}:/extra",
                                                    "NOPE": "${NOPE_NOT_SET}:/x"}})

    @ray.remote
    def probe():
        return _env("MYPATH", "NOPE")

    assert ray.get(probe.remote(), timeout=60) == ("/base:/extra", ":/x")
    task_env = {"env_vars": {"NOPE": "${MYPATH}-t", "PLAIN": "$MYPATH"}}
    assert ray.get(probe.options(runtime_env=task_env).remote(), timeout=60) == (
        "/base:/extra", "/base:/extra-t")
    assert ray.get_runtime_context().runtime_env["env_vars"]["MYPATH"] == "${MYPATH}:/extra"


def test_options_runtime_env_replaces_the_decorators(ray):
    """``.options(runtime_env=...)`` replaces the decorator's runtime_env as a whole (Ray
    2.60: the decorator's C is gone when options set B)."""

    @ray.remote(runtime_env={"env_vars": {"C": "deco"}})
    def probe():
        return _env("B", "C")

    assert ray.get(probe.remote(), timeout=60) == (None, "deco")
    assert ray.get(probe.options(runtime_env={"env_vars": {"B": "opt"}}).remote(),
                   timeout=60) == ("opt", None)


def test_nested_tasks_inherit_their_parents_environment(ray_start):
    """A task submitted inside a task runs in its parent's environment, and one that names
    its own merges it over the parent's (Ray 2.60: A job, B parent, C child)."""
    import miniray as ray

    ray_start(num_cpus=2, runtime_env={"env_vars": {"A": "job"}})

    @ray.remote
    def leaf():
        return _env("A", "B", "C")

    @ray.remote
    def parent():
        return (ray.get(leaf.remote(), timeout=60),
                ray.get(leaf.options(runtime_env={"env_vars": {"C": "child"}}).remote(),
                        timeout=60))

    inherited, merged = ray.get(
        parent.options(runtime_env={"env_vars": {"B": "parent"}}).remote(), timeout=90)
    assert inherited == ("job", "parent", None)
    assert merged == ("job", "parent", "child")


def test_actor_env_vars_and_its_nested_tasks(ray_start):
    """An actor's env_vars are merged over the job's; tasks it submits inherit them."""
    import miniray as ray

    ray_start(num_cpus=2, runtime_env={"env_vars": {"A": "job"}})

    @ray.remote
    def leaf():
        return _env("A", "C")

    @ray.remote
    class Probe:
        def env(self):
            return _env("A", "C")

        def nested(self):
            return ray.get(leaf.remote(), timeout=60)

    actor = Probe.options(runtime_env={"env_vars": {"C": "actor"}}).remote()
    assert ray.get(actor.env.remote(), timeout=60) == ("job", "actor")
    assert ray.get(actor.nested.remote(), timeout=60) == ("job", "actor")
    plain = Probe.remote()
    assert ray.get(plain.env.remote(), timeout=60) == ("job", None)


def test_runtime_env_values_are_checked_at_options(ray):
    """Ray's types and wording, raised by ``.options()`` and ``@remote`` (not at get)."""

    @ray.remote
    def f():
        return 1

    with pytest.raises(TypeError, match=r"but the value 1 is of type <class 'int'>"):
        f.options(runtime_env={"env_vars": {"A": 1}})
    with pytest.raises(TypeError, match="The type of keyword 'runtime_env' must be"):
        f.options(runtime_env="abc")
    with pytest.raises(ValueError, match="setup_timeout_seconds must be greater than zero"):
        f.options(runtime_env={"config": {"setup_timeout_seconds": 0}})
    with pytest.raises(TypeError, match="eager_install must be a boolean"):
        f.options(runtime_env={"config": {"eager_install": "yes"}})
    with pytest.raises(ValueError, match="cannot be specified at the same time"):
        f.options(runtime_env={"pip": ["x"], "conda": "y"})
    with pytest.raises(TypeError, match="not JSON serializable"):
        f.options(runtime_env={"worker_process_setup_hook": lambda: None})
    with pytest.raises(ValueError, match="only supported at the job level"):
        ray.remote(runtime_env={"working_dir": "/tmp"})(lambda: 1)
    with pytest.raises(ValueError, match="is not a valid path"):
        f.options(runtime_env={"py_modules": ["local:///x", "/no/such/module"]})
    ok = f.options(runtime_env={"config": {"setup_timeout_seconds": 5, "eager_install": False},
                                "env_vars": {}})
    assert ray.get(ok.remote(), timeout=60) == 1


def test_init_checks_its_runtime_env(ray_start, tmp_path):
    """init() refuses a bad runtime_env before starting anything, with Ray's errors (Ray
    2.60: TypeError for an int env var, ValueError for a missing working_dir)."""
    with pytest.raises(TypeError, match="but the value 1 is of type"):
        ray_start(num_cpus=1, runtime_env={"env_vars": {"A": 1}})
    missing = str(tmp_path / "missing")
    with pytest.raises(ValueError, match=f"directory {missing} must be an existing directory"):
        ray_start(num_cpus=1, runtime_env={"working_dir": missing})


# ----------------------------------------------------------------- working_dir, py_modules


def test_task_working_dir_local_uri_is_cwd_and_first_on_sys_path(ray, tmp_path):
    """``local://`` directories work per task, in place (Ray 2.60: cwd is the directory, it is
    on sys.path ahead of the user's and on PYTHONPATH)."""
    folder = tmp_path / "wd"
    _write(folder / "wd_module_a.py", "WHERE = 'task working_dir'\n")

    @ray.remote
    def probe():
        import wd_module_a

        return os.getcwd(), sys.path.index(os.getcwd()), wd_module_a.WHERE, \
            os.environ["PYTHONPATH"].split(os.pathsep)[0]

    cwd, index, where, pythonpath = ray.get(
        probe.options(runtime_env={"working_dir": f"local://{folder}"}).remote(), timeout=60)
    assert cwd == str(folder) == pythonpath
    assert index == 0
    assert where == "task working_dir"

    @ray.remote
    def cwd():
        return os.getcwd()

    assert ray.get(cwd.remote(), timeout=60) != str(folder)


def test_job_working_dir_and_py_modules_are_used_in_place(ray_start, tmp_path):
    """init()'s working_dir is every worker's cwd; py_modules directories and .py files
    import by their own name, their siblings do not (Ray 2.60 uploads copies; miniray uses
    the paths themselves, so a file written there is the user's own)."""
    import miniray as ray

    wd = tmp_path / "project"
    _write(wd / "job_wd_module.py", "VALUE = 'from working_dir'\n")
    libs = tmp_path / "libs"
    _write(libs / "job_pkg" / "__init__.py", "VALUE = 'from a package'\n")
    _write(libs / "job_single.py", "VALUE = 'from a file'\n")
    _write(libs / "job_sibling.py", "VALUE = 'never imported'\n")
    driver_cwd = os.getcwd()
    ray_start(num_cpus=2, runtime_env={
        "working_dir": str(wd),
        "py_modules": [str(libs / "job_pkg"), str(libs / "job_single.py")]})
    assert os.getcwd() == driver_cwd

    @ray.remote
    def probe():
        import job_pkg
        import job_single
        import job_wd_module

        with open("written.txt", "w") as f:
            f.write("x")
        try:
            import job_sibling  # noqa: F401
            sibling = True
        except ImportError:
            sibling = False
        return os.getcwd(), job_wd_module.VALUE, job_pkg.VALUE, job_single.VALUE, sibling

    assert ray.get(probe.remote(), timeout=60) == (
        str(wd), "from working_dir", "from a package", "from a file", False)
    assert (wd / "written.txt").exists()
    assert ray.get_runtime_context().runtime_env == {
        "working_dir": str(wd),
        "py_modules": [str(libs / "job_pkg"), str(libs / "job_single.py")]}


def test_task_py_modules_local_uri(ray, tmp_path):
    """A ``local://`` py_modules entry goes on sys.path as it is (Ray 2.60: its contents
    import)."""
    _write(tmp_path / "mods" / "uri_pkg" / "__init__.py", "VALUE = 7\n")

    @ray.remote
    def probe():
        import uri_pkg

        return uri_pkg.VALUE

    options = {"py_modules": [f"local://{tmp_path / 'mods'}"]}
    assert ray.get(probe.options(runtime_env=options).remote(), timeout=60) == 7


def test_missing_local_uri_fails_at_get(ray, tmp_path):
    """A ``local://`` directory that does not exist fails the task with
    RuntimeEnvSetupError at get (as Ray 2.60)."""

    @ray.remote
    def f():
        return 1

    ref = f.options(runtime_env={"working_dir": f"local://{tmp_path}/none"}).remote()
    with pytest.raises(RuntimeEnvSetupError, match="working_dir"):
        ray.get(ref, timeout=60)


# --------------------------------------------------------------------- refused fields

REFUSED = [
    ("pip", ["requests"], "pip"),
    ("uv", ["requests"], "uv pip"),
    ("conda", "myenv", "conda environment"),
    ("container", {"image": "repo/image:tag"}, "inside that container"),
    ("image_uri", "repo/image:tag", "inside that image"),
]


@pytest.mark.parametrize("field,value,hint", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_fields_fail_the_task_at_get(ray, field, value, hint):
    """Ray 2.60 returns the ref and raises RuntimeEnvSetupError (not a RayTaskError) from
    get() when the environment cannot be set up; so does miniray, saying what to do."""

    @ray.remote
    def f():
        return 1

    ref = f.options(runtime_env={field: value}).remote()
    with pytest.raises(RuntimeEnvSetupError) as caught:
        ray.get(ref, timeout=60)
    text = str(caught.value)
    assert not isinstance(caught.value, RayTaskError)
    assert text.startswith("Failed to set up runtime environment.\n")
    assert f"'{field}'" in text and hint in text and "run the program on Ray" in text
    assert ray.get(f.remote(), timeout=60) == 1  # the session goes on


def test_unsupported_field_fails_every_call_of_an_actor(ray):
    """As Ray 2.60: the handle is returned, each call raises RuntimeEnvSetupError saying the
    actor could not be created."""

    @ray.remote
    class Actor:
        def ping(self):
            return "pong"

    actor = Actor.options(runtime_env={"pip": ["requests"]}).remote()
    for _ in range(2):
        with pytest.raises(RuntimeEnvSetupError, match="Could not create the actor"):
            ray.get(actor.ping.remote(), timeout=60)


def test_unsupported_field_in_init_fails_its_tasks(ray_start):
    """init(runtime_env={"pip": ...}) starts (Ray 2.60 too); its tasks fail at get."""
    import miniray as ray

    ray_start(num_cpus=1, runtime_env={"pip": ["requests"]})

    @ray.remote
    def f():
        return 1

    with pytest.raises(RuntimeEnvSetupError, match="'pip'"):
        ray.get(f.remote(), timeout=60)


def test_unknown_field_is_accepted_and_named(ray, caplog):
    """Ray 2.60 accepts an unknown field (it would look for a plugin) and runs the task;
    miniray too, and logs once that it is ignored."""

    @ray.remote
    def f():
        return ray.get_runtime_context().runtime_env

    with caplog.at_level("WARNING"):
        wrapped = f.options(runtime_env={"made_up_field_x": 1})
    assert "made_up_field_x" in caplog.text
    assert ray.get(wrapped.remote(), timeout=60) == {"made_up_field_x": 1}


# ------------------------------------------------------------------ setup hook


_HOOK = """
import os

def setup():
    os.environ["HOOK_PID"] = str(os.getpid())
    os.environ["HOOK_RUNS"] = str(int(os.environ.get("HOOK_RUNS", "0")) + 1)

def fails():
    raise RuntimeError("hook exploded")
"""


@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    _write(tmp_path / "hooks" / "rt_env_hooks.py", _HOOK)
    monkeypatch.syspath_prepend(str(tmp_path / "hooks"))  # workers get the driver's path
    return "rt_env_hooks"


def test_setup_hook_runs_once_in_each_worker(ray_start, hook_module):
    """A "module.function" hook runs once per worker process before its first task, in
    task and actor workers (Ray 2.60: the env var it sets is seen by every task of that
    worker, and the context reports the hook)."""
    import miniray as ray

    ray_start(num_cpus=2, runtime_env={"worker_process_setup_hook": f"{hook_module}.setup"})

    @ray.remote
    def probe():
        return os.environ.get("HOOK_PID"), os.environ.get("HOOK_RUNS"), os.getpid()

    @ray.remote
    class Actor:
        def probe(self):
            return os.environ.get("HOOK_PID"), os.getpid()

    for hook_pid, runs, pid in [ray.get(probe.remote(), timeout=60) for _ in range(3)]:
        assert (hook_pid, runs) == (str(pid), "1")
    hook_pid, pid = ray.get(Actor.remote().probe.remote(), timeout=60)
    assert hook_pid == str(pid)
    other = ray.get(probe.options(runtime_env={"env_vars": {"X": "1"}}).remote(), timeout=60)
    assert other[0] == str(other[2])  # a worker of another environment runs it too
    assert ray.get_runtime_context().runtime_env == {
        "worker_process_setup_hook": f"{hook_module}.setup"}


def test_setup_hook_callable(ray_start):
    """A function as the hook (Ray 2.60 exports it; the context names it)."""
    import miniray as ray

    def mark_worker():
        os.environ["HOOKED_BY"] = "callable"

    ray_start(num_cpus=1, runtime_env={"worker_process_setup_hook": mark_worker})

    @ray.remote
    def probe():
        return os.environ.get("HOOKED_BY"), ray.get_runtime_context().runtime_env

    assert ray.get(probe.remote(), timeout=60) == (
        "callable", {"worker_process_setup_hook": "mark_worker"})


def test_failing_setup_hook_ends_the_worker(ray_start, hook_module, capfd):
    """Ray 2.60: the worker exits with the hook's traceback; the task fails with
    WorkerCrashedError once its retries are spent, an actor's calls with ActorDiedError."""
    import miniray as ray

    ray_start(num_cpus=1, runtime_env={"worker_process_setup_hook": f"{hook_module}.fails"})

    @ray.remote(max_retries=0)
    def f():
        return 1

    @ray.remote
    class Actor:
        def ping(self):
            return 1

    with pytest.raises(WorkerCrashedError):
        ray.get(f.remote(), timeout=60)
    with pytest.raises(ActorDiedError):
        ray.get(Actor.remote().ping.remote(), timeout=60)
    err = capfd.readouterr().err
    assert f"Failed to execute the setup hook method, {hook_module}.fails" in err
    assert "RuntimeError: hook exploded" in err


def test_task_level_setup_hook_is_ignored_as_in_ray(ray, caplog):
    """Ray 2.60 keeps a task's worker_process_setup_hook string but never runs it (only
    init()'s runs); miniray does the same and says so once."""

    @ray.remote
    def probe():
        return os.environ.get("HOOK_PID")

    with caplog.at_level("WARNING"):
        wrapped = probe.options(runtime_env={"worker_process_setup_hook": "nowhere.hook"})
    assert "only init(runtime_env=...)'s hook runs" in caplog.text
    assert ray.get(wrapped.remote(), timeout=60) is None


# ------------------------------------------------------------------ RuntimeContext


def test_runtime_context_reports_the_environment(ray_start):
    """``runtime_env`` is a RuntimeEnv of the merged environment; the string is the job's
    JSON with spaces, a task's own without (both as Ray 2.60 prints them)."""
    import miniray as ray

    ray_start(num_cpus=2, runtime_env={"env_vars": {"A": "job", "B": "job"}})
    context = ray.get_runtime_context()
    assert isinstance(context.runtime_env, RuntimeEnv)
    assert context.runtime_env == {"env_vars": {"A": "job", "B": "job"}}
    assert context.get_runtime_env_string() == '{"env_vars": {"A": "job", "B": "job"}}'

    @ray.remote
    def probe():
        context = ray.get_runtime_context()
        return dict(context.runtime_env), context.get_runtime_env_string()

    assert ray.get(probe.remote(), timeout=60) == (
        {"env_vars": {"A": "job", "B": "job"}}, '{"env_vars": {"A": "job", "B": "job"}}')
    own = probe.options(runtime_env={"env_vars": {"B": "task", "C": "task"}}).remote()
    assert ray.get(own, timeout=60) == (
        {"env_vars": {"A": "job", "B": "task", "C": "task"}},
        '{"env_vars":{"A":"job","B":"task","C":"task"}}')


def _deprecated_view(where: str):
    import miniray as ray

    context = ray.get_runtime_context()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = context.get()
        job_id, node_id = context.job_id, context.node_id
    kinds = {name: type(value).__name__ for name, value in got.items()}
    messages = [str(w.message).rsplit("\n", 1)[-1] for w in caught
                if issubclass(w.category, RayDeprecationWarning)]
    return (kinds, job_id.hex(), node_id.hex() == context.get_node_id(),
            repr(job_id), messages, where)


def test_runtime_context_deprecated_members(ray):
    """``get()`` and the id properties return Ray 2.60's keys and id types, each with a
    RayDeprecationWarning naming its replacement; driver-only rules as Ray's."""
    kinds, job_hex, same_node, job_repr, messages, _ = _deprecated_view("driver")
    assert kinds == {"job_id": "JobID", "node_id": "NodeID", "namespace": "str"}
    assert (job_hex, same_node, job_repr) == ("01000000", True, "JobID(01000000)")
    assert messages[0] == "Use get_xxx_id() methods to get relevant ids instead"
    assert "Use get_job_id() instead" in messages and "Use get_node_id() instead" in messages
    context = ray.get_runtime_context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="only available when the process is a"):
            _ = context.task_id
        with pytest.raises(AssertionError):
            _ = context.actor_id
        assert context.current_placement_group_id.is_nil()
        assert context.get_resource_ids() == context.get_accelerator_ids()
    with pytest.raises(RuntimeError, match="only available when the process is a worker"):
        context.is_canceled()
    assert context.should_capture_child_tasks_in_placement_group is False

    @ray.remote
    def in_task():
        task_kinds = _deprecated_view("task")[0]
        context = ray.get_runtime_context()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            same = context.task_id.hex() == context.get_task_id()
        return task_kinds, same, context.get_actor_id()

    @ray.remote
    class Actor:
        def view(self):
            context = ray.get_runtime_context()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                same = context.actor_id.hex() == context.get_actor_id()
                restarted = context.was_current_actor_reconstructed
            return _deprecated_view("actor")[0], same, restarted

    task_kinds, same_task, actor_id = ray.get(in_task.remote(), timeout=60)
    assert task_kinds == {"job_id": "JobID", "node_id": "NodeID", "namespace": "str",
                          "task_id": "TaskID"}
    assert same_task and actor_id is None
    actor_kinds, same_actor, restarted = ray.get(Actor.remote().view.remote(), timeout=60)
    assert actor_kinds == {"job_id": "JobID", "node_id": "NodeID", "namespace": "str",
                           "task_id": "TaskID", "actor_id": "ActorID"}
    assert same_actor and restarted is False


def test_was_current_actor_reconstructed_after_a_restart(ray):
    """False in the first process of an actor, True once it was restarted (Ray 2.60 reads
    the actor's restart count)."""
    import time

    from miniray.exceptions import RayActorError

    @ray.remote(max_restarts=1)
    class Actor:
        def restarted(self):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return ray.get_runtime_context().was_current_actor_reconstructed

        def die(self):
            os._exit(1)

    actor = Actor.remote()
    assert ray.get(actor.restarted.remote(), timeout=60) is False
    actor.die.remote()
    deadline = time.monotonic() + 60
    while True:
        try:
            assert ray.get(actor.restarted.remote(), timeout=60) is True
            break
        except RayActorError:  # the call raced with the death; the restart follows
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_named_actor_on_a_node_gets_its_creators_environment(node_env):
    """A named actor of a driver joined to a node lives in the node's actor service; it still
    runs in its creator's environment (init's env_vars, its own merged over them), as under
    Ray, where the job's runtime_env follows its actors to any node."""
    from .helpers import cli, driver, json_line

    started = cli(node_env, "start", "--head", "--num-cpus", "2")
    assert started.returncode == 0, started.stderr
    proc = driver("""
        import json, os
        import miniray as ray
        ray.init(address="auto", runtime_env={"env_vars": {"JOB_VAR": "job"}})

        @ray.remote
        class Probe:
            def env(self):
                return os.environ.get("JOB_VAR"), os.environ.get("OWN_VAR")

        plain = Probe.options(name="plain_probe").remote()
        own = Probe.options(name="own_probe",
                            runtime_env={"env_vars": {"OWN_VAR": "own"}}).remote()
        refused = Probe.options(name="pip_probe", runtime_env={"pip": ["requests"]}).remote()
        try:
            ray.get(refused.env.remote(), timeout=60)
            error = None
        except ray.exceptions.RuntimeEnvSetupError as caught:
            error = "Could not create the actor" in str(caught)
        print(json.dumps({"plain": ray.get(plain.env.remote(), timeout=60),
                          "own": ray.get(own.env.remote(), timeout=60),
                          "refused": error}), flush=True)
    """, node_env)
    try:
        assert json_line(proc, timeout=90) == {"plain": ["job", None], "own": ["job", "own"],
                                               "refused": True}
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


def test_job_config_namespace_applies_unless_init_names_one(ray_start):
    """Ray 2.60 (its test_namespace_in_job_config): JobConfig(ray_namespace=...) is the
    job's namespace; init(namespace=...) takes its place."""
    import miniray as ray
    from miniray.job_config import JobConfig

    ray_start(num_cpus=1, job_config=JobConfig(ray_namespace="from-config"))
    assert ray.get_runtime_context().namespace == "from-config"
    ray.shutdown()
    ray_start(num_cpus=1, namespace="from-init", job_config=JobConfig(ray_namespace="x"))
    assert ray.get_runtime_context().namespace == "from-init"


def test_job_config_runtime_env_applies_unless_init_names_one(ray_start):
    """Ray 2.60: init(job_config=JobConfig(runtime_env=...)) sets the job's environment; a
    runtime_env given to init() itself takes its place."""
    import miniray as ray
    from miniray.job_config import JobConfig

    ray_start(num_cpus=1, job_config=JobConfig(runtime_env={"env_vars": {"FROM": "config"}}))

    @ray.remote
    def probe():
        return os.environ.get("FROM")

    assert ray.get(probe.remote(), timeout=60) == "config"
    ray.shutdown()
    ray_start(num_cpus=1, runtime_env={"env_vars": {"FROM": "init"}},
              job_config=JobConfig(runtime_env={"env_vars": {"FROM": "config"}}))
    assert ray.get(probe.remote(), timeout=60) == "init"
