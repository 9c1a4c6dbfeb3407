"""ObjectRefGenerator: what ``.remote()`` returns for a generator function.

Owns: iterating the values a generator task yielded, as refs. Does not own: running the task.
Called by: remote_function.py, api.py (get/wait/cancel accept generators).

Mirrors ``ray.ObjectRefGenerator`` (Ray 2.60). Differs: the task runs to completion before the
first ref is available (values are not streamed one by one while the task still runs); each
value becomes its own object when the iteration reaches it.
"""

from __future__ import annotations


class ObjectRefGenerator:
    """Iterate to get one ObjectRef per value the generator task yielded."""

    def __init__(self, ref):
        self._ref = ref
        self._values: list | None = None
        self._index = 0

    def _wait_ref(self):
        return self._ref

    def _load(self) -> list:
        if self._values is None:
            from miniray._private import api

            self._values = api.get(self._ref)
        return self._values

    def __iter__(self):
        return self

    def __next__(self):
        values = self._load()
        if self._index >= len(values):
            raise StopIteration
        value = values[self._index]
        self._index += 1
        from miniray._private import api

        return api.put(value)

    def __aiter__(self):
        return self

    async def __anext__(self):
        import asyncio

        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.__next__)
        except StopIteration:
            raise StopAsyncIteration from None

    def completed(self):
        return self._ref

    def is_finished(self) -> bool:
        return self._values is not None and self._index >= len(self._values)

    def next_ready(self) -> bool:
        from miniray._private import api

        ready, _ = api.wait([self._ref], timeout=0)
        return bool(ready)

    def close(self) -> None:
        self._values = []

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._ref.hex()})"


ObjectRefGenerator.__module__ = "miniray"
