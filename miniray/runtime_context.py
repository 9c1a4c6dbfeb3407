"""RuntimeContext: what a driver, task or actor can ask about where it runs.

Mirrors ``ray.runtime_context`` (Ray 2.60). Differs: ``get_node_labels`` returns only the
node-id label; the deprecated ``get()`` and id properties are not provided.
"""

from __future__ import annotations

from miniray._private import runtime
from miniray.actor import ActorHandle

__all__ = ["RuntimeContext", "get_runtime_context"]

_ACCELERATORS = ("GPU", "neuron_cores", "TPU", "HPU", "NPU", "RBLN", "FURIOSA", "MBLT", "TTNPU")


class RuntimeContext:
    """Information about the current driver, task or actor."""

    def __init__(self, rt):
        self._rt = rt

    def _task(self):
        return getattr(self._rt, "task", None)

    def get_job_id(self) -> str:
        return "01000000"

    def get_node_id(self) -> str:
        rt = self._rt
        return rt.node_id if rt.mode == "driver" else rt.info["node_id"]

    def get_worker_id(self) -> str:
        return self._rt.worker_id

    def get_task_id(self) -> str | None:
        task = self._task()
        return task.task_id.hex() if task is not None else None

    def get_task_name(self) -> str | None:
        task = self._task()
        return task.name if task is not None else None

    def get_task_function_name(self) -> str | None:
        task = self._task()
        return task.function_name if task is not None else None

    def _actor(self):
        return getattr(self._rt, "actor", None)

    def get_actor_id(self) -> str | None:
        actor = self._actor()
        return actor.actor_id.hex() if actor is not None else None

    def get_actor_name(self) -> str | None:
        actor = self._actor()
        return actor.name if actor is not None else None

    def get_assigned_resources(self) -> dict:
        assert self._rt.mode == "worker", (
            "This method is only available when the process is a worker. Current mode: driver"
        )
        return self._rt.assigned_resources()

    def get_accelerator_ids(self) -> dict:
        ids = {name: [] for name in _ACCELERATORS}
        if self._rt.mode == "worker":
            ids["GPU"] = [str(i) for i in self._rt.get_gpu_ids()]
        return ids

    def get_placement_group_id(self) -> str | None:
        return None

    @property
    def namespace(self) -> str:
        rt = self._rt
        return rt.namespace if rt.mode == "driver" else rt.info.get("namespace", "")

    @property
    def gcs_address(self) -> str:
        return "127.0.0.1:0"

    @property
    def runtime_env(self) -> dict:
        return {}

    def get_runtime_env_string(self) -> str:
        return "{}"

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
        checker = getattr(self._rt, "is_canceled", None)
        if checker is None:
            raise RuntimeError("This method is only available when the process is a worker. "
                               "Current mode: 0")
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
