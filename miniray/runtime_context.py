"""RuntimeContext: what a driver, task or actor can ask about where it runs.

Mirrors ``ray.runtime_context`` (Ray 2.60), every public member: the ``get_*`` methods, the
properties, and the deprecated ``get()``, ``job_id``, ``node_id``, ``task_id``,
``actor_id``, ``current_placement_group_id`` and ``get_resource_ids()`` (they warn with
``RayDeprecationWarning`` and return id objects, as Ray's). Differs: ``get_node_labels``
returns only the node-id label; ``gcs_address`` names no real server; a plain task's
``was_current_actor_reconstructed`` raises Ray's AssertionError (Ray 2.60 fails with an
AttributeError there).
"""

from __future__ import annotations

import functools
import logging
import warnings

from miniray._private import runtime
from miniray._private.core import ids, runtime_envs
from miniray.actor import ActorHandle
from miniray.runtime_env import RuntimeEnv
from miniray.util.annotations import RayDeprecationWarning

logger = logging.getLogger(__name__)

# Ray's text: its worker modes are numbers (0 is a driver), and its assertion message keeps
# the indentation of a continued line.
_WORKER_ONLY = ("This method is only available when the process is a                 worker. "
                "Current mode: 0")
_WORKER_ONLY_LOG = "This method is only available when the process is a worker. Current mode: 0"


def _deprecated(message: str):
    """Warn as Ray's ``@Deprecated(message=..., warning=True)`` does, then call through."""
    text = ("This API is deprecated and may be removed in future Ray releases. You could "
            'suppress this warning by setting env variable '
            'PYTHONWARNINGS="ignore::DeprecationWarning"\n' + message)

    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            warnings.warn(text, RayDeprecationWarning, stacklevel=2)
            return function(*args, **kwargs)

        return wrapper

    return decorate

__all__ = ["RuntimeContext", "get_runtime_context"]

_ACCELERATORS = ("GPU", "neuron_cores", "TPU", "HPU", "NPU", "RBLN", "FURIOSA", "MBLT", "TTNPU")


class RuntimeContext:
    """Information about the current driver, task or actor."""

    def __init__(self, rt):
        self._rt = rt

    def _task(self):
        rt = self._rt
        task = getattr(rt, "task", None)
        if task is None:  # a thread the task started: the task's, as in Ray
            task = getattr(rt, "main_task", None)
        return task

    def _in_driver(self) -> bool:
        return self._rt.mode == "driver"

    @_deprecated("Use get_xxx_id() methods to get relevant ids instead")
    def get(self) -> dict:
        """Deprecated: ``job_id``, ``node_id``, ``namespace``, and in a worker ``task_id``
        and ``actor_id`` when there is one (as id objects)."""
        context = {"job_id": self.job_id, "node_id": self.node_id,
                   "namespace": self.namespace}
        if not self._in_driver():
            if self.task_id is not None:
                context["task_id"] = self.task_id
            if self.actor_id is not None:
                context["actor_id"] = self.actor_id
        return context

    @property
    @_deprecated("Use get_job_id() instead")
    def job_id(self) -> ids.JobID:
        return ids.JobID.from_hex(self.get_job_id())

    @property
    @_deprecated("Use get_node_id() instead")
    def node_id(self) -> ids.NodeID:
        return ids.NodeID.from_hex(self.get_node_id())

    @property
    @_deprecated("Use get_task_id() instead")
    def task_id(self) -> ids.TaskID | None:
        assert not self._in_driver(), _WORKER_ONLY
        task = self._task()
        return ids.TaskID(task.task_id) if task is not None else None

    @property
    @_deprecated("Use get_actor_id() instead")
    def actor_id(self) -> ids.ActorID | None:
        assert not self._in_driver(), _WORKER_ONLY
        actor = self._actor()
        return ids.ActorID(actor.actor_id) if actor is not None else None

    @property
    @_deprecated("Use get_placement_group_id() instead")
    def current_placement_group_id(self) -> ids.PlacementGroupID:
        current = self._rt.current_placement()
        if current is None:
            return ids.PlacementGroupID.nil()
        return ids.PlacementGroupID(bytes.fromhex(current[0]))

    @_deprecated("Use get_accelerator_ids() instead")
    def get_resource_ids(self) -> dict:
        return self.get_accelerator_ids()

    def get_job_id(self) -> str:
        return ids.JOB_ID  # the driver's, in its workers too (set from HELLO)

    def get_node_id(self) -> str:
        rt = self._rt
        return rt.node_id if rt.mode == "driver" else rt.info["node_id"]

    def get_worker_id(self) -> str:
        return self._rt.worker_id

    def _driver_note(self) -> bool:
        """In the driver: log Ray's warning and return True (the caller returns None)."""
        if self._in_driver():
            logger.warning(_WORKER_ONLY_LOG)
            return True
        return False

    def get_task_id(self) -> str | None:
        if self._driver_note():
            return None
        task = self._task()
        return task.task_id.hex() if task is not None else None

    def get_task_name(self) -> str | None:
        if self._driver_note():
            return None
        task = self._task()
        return task.name if task is not None else None

    def get_task_function_name(self) -> str | None:
        if self._driver_note():
            return None
        task = self._task()
        return task.function_name if task is not None else None

    def _actor(self):
        return getattr(self._rt, "actor", None)

    def get_actor_id(self) -> str | None:
        actor = self._actor()
        return actor.actor_id.hex() if actor is not None else None

    def get_actor_name(self) -> str | None:
        if self._driver_note():
            return None
        actor = self._actor()
        if actor is None:
            return None
        return actor.name or ""  # an unnamed actor's is "", as Ray's

    def get_assigned_resources(self) -> dict:
        assert not self._in_driver(), _WORKER_ONLY
        return self._rt.assigned_resources()

    def get_accelerator_ids(self) -> dict:
        ids = {name: [] for name in _ACCELERATORS}
        if self._rt.mode == "worker":
            ids["GPU"] = [str(i) for i in self._rt.get_gpu_ids()]
        return ids

    def get_placement_group_id(self) -> str | None:
        """The hex id of the placement group the caller runs in, None if it runs in none."""
        current = self._rt.current_placement()
        return None if current is None else current[0]

    @property
    def namespace(self) -> str:
        rt = self._rt
        return rt.namespace if rt.mode == "driver" else rt.info.get("namespace", "")

    @property
    def gcs_address(self) -> str:
        return "127.0.0.1:0"

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        current = self._rt.current_placement()
        return bool(current is not None and current[2])

    @property
    def runtime_env(self) -> RuntimeEnv:
        """The runtime environment this driver, task or actor runs in: the job's (init's),
        with a task's or actor's own merged over it."""
        return RuntimeEnv.deserialize(self.get_runtime_env_string())

    def get_runtime_env_string(self) -> str:
        rt = self._rt
        return runtime_envs.string_of(rt.runtime_env, job=not rt.runtime_env_key)

    def get_session_name(self) -> str:
        rt = self._rt
        path = rt.session_dir if rt.mode == "driver" else rt.info["session_dir"]
        return path.rstrip("/").rsplit("/", 1)[-1]

    def get_temp_dir(self) -> str:
        rt = self._rt
        path = rt.session_dir if rt.mode == "driver" else rt.info["session_dir"]
        return path.rstrip("/").rsplit("/", 1)[0]

    def get_node_labels(self) -> dict:
        return {"ray.io/node-id": self.get_node_id()}

    def is_canceled(self) -> bool:
        """Whether ``cancel()`` was called on the running task or sync actor call (for an
        actor call Ray only sets this flag: the method decides when to stop).

        Raises:
            RuntimeError: In the driver, or in an async actor (as in Ray 2.60).
        """
        if self._in_driver():
            raise RuntimeError(_WORKER_ONLY_LOG)
        checker = getattr(self._rt, "is_canceled", None)
        if checker is None:
            raise RuntimeError(_WORKER_ONLY_LOG)
        return bool(checker())

    @property
    def current_actor(self):
        actor = self._actor()
        if actor is None:
            raise RuntimeError("This method is only available in an actor.")
        return ActorHandle(actor.actor_id, actor.handle_state)

    @property
    def was_current_actor_reconstructed(self) -> bool:
        """Inside an actor: whether it was ever restarted (False on its first start).

        Raises:
            AssertionError: outside an actor (Ray 2.60's type, in the driver and in tasks).
        """
        actor = self._actor()
        if actor is None:
            where = "a task" if getattr(self._rt, "mode", "driver") == "worker" else "the driver"
            raise AssertionError(
                f"was_current_actor_reconstructed is only available inside an actor, not in "
                f"{where}.")
        return actor.restarts > 0


def get_runtime_context() -> RuntimeContext:
    """The context of this driver, task or actor (starts miniray if needed, as Ray does)."""
    return RuntimeContext(runtime.auto_init())
