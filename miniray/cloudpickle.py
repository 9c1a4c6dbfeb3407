"""``miniray.cloudpickle``: the cloudpickle that miniray serializes values with.

Mirrors ``ray.cloudpickle`` (Ray 2.60 ships its own copy there; miniray depends on the
``cloudpickle`` package and re-exports it): ``dumps``, ``loads``, ``dump``, ``load``,
``CloudPickler``/``Pickler``, ``register_pickle_by_value``, ``unregister_pickle_by_value``,
``DEFAULT_PROTOCOL``, ``PicklingError``. Differs: Ray's debugging variants (``dumps_debug``...)
are not provided.

Example:
    >>> from miniray import cloudpickle
    >>> cloudpickle.loads(cloudpickle.dumps(lambda x: x + 1))(1)
    2
"""

from __future__ import annotations

from pickle import PicklingError

from cloudpickle import (
    DEFAULT_PROTOCOL,
    CloudPickler,
    Pickler,
    dump,
    dumps,
    load,
    loads,
    register_pickle_by_value,
    unregister_pickle_by_value,
)

__all__ = ["CloudPickler", "DEFAULT_PROTOCOL", "Pickler", "PicklingError", "dump", "dumps",
           "load", "loads", "register_pickle_by_value", "unregister_pickle_by_value"]
