"""``miniray.internal``: mirrors ``ray.internal`` (Ray 2.60), an empty namespace package kept so
that ``import ray.internal`` and ``ray.internal`` resolve as in Ray."""

__all__: list = []
