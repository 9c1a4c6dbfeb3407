"""TaskSpec: everything the owner needs to run one task, as built by ``.remote()``.

Owns: the fields of a task submission and their pickled form (a worker submitting a nested task
sends its TaskSpec to the owner). Does not own: validation (``options.py``) or scheduling
(``owner.py``).
"""

from __future__ import annotations

from typing import Any


class TaskSpec:
    """One task submission. ``fn_bytes`` is None when the owner already has the function."""

    __slots__ = (
        "task_id",
        "fn_id",
        "fn_bytes",
        "name",
        "function_name",
        "args_blob",
        "deps",
        "return_ids",
        "num_returns",
        "request",
        "max_retries",
        "retry_exceptions",
        "max_calls",
        "contained",
    )

    def __init__(
        self,
        task_id: bytes,
        fn_id: bytes,
        fn_bytes: bytes | None,
        name: str,
        function_name: str,
        args_blob: bytes,
        deps: list[tuple[Any, bytes]],
        return_ids: list[bytes],
        num_returns: int,
        request: dict[str, float],
        max_retries: int,
        retry_exceptions: Any,
        max_calls: int,
        contained: tuple = (),
    ):
        self.task_id = task_id
        self.fn_id = fn_id
        self.fn_bytes = fn_bytes
        self.name = name
        self.function_name = function_name
        self.args_blob = args_blob
        self.deps = deps
        self.return_ids = return_ids
        self.num_returns = num_returns
        self.request = request
        self.max_retries = max_retries
        self.retry_exceptions = retry_exceptions
        self.max_calls = max_calls
        self.contained = contained  # ids of refs nested in the arguments: held while pending

    def __reduce__(self):
        return (TaskSpec, tuple(getattr(self, name) for name in TaskSpec.__slots__))

    def __repr__(self) -> str:
        return f"<TaskSpec {self.name} {self.task_id.hex()[:12]} request={self.request}>"
