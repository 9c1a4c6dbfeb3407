"""miniray internals. Nothing here is public API; it may change without notice.

The folders are the layers. A module imports only from its own layer or a lower one, never
from a higher one, and the import graph has no cycle, counting imports inside functions
(``tests/unit/test_layers.py`` holds both rules, and fails on a module no layer names)::

    cli.py                     the ``miniray`` command
      |
    node/                      the ``miniray start`` processes: node, its actor service,
      |                        status, daemon start/stop, the dashboard (the actor
      |                        service *is* a driver)
    runtime.py api.py          init/shutdown and the driver's composition; the bodies of the
    surface.py                 public functions; remote/method/get_actor/kill; Ray's path
    object_ref_generator.py    of the generator types; the state API's reader; init()'s
    state_api.py               argument checks; the driver's store and session files;
    init_args.py               Ray's private ``internal_api.memory_summary``
    driver_session.py
    internal_api.py
      |                        (the public modules, miniray/*.py and util/, sit here too)
    owner/      worker/        the driver's engine under one lock | the worker process
      |
    object_store/  ledger/     values in shared memory | who holds which resources, host
      |                        inventory
    host/      transport/      session files, process identity | sockets, framing, the
      |                        reactor, the client halves of the spawn channels
    core/                      pure: ids, options, resources arithmetic, protocol tags,
                               serialization, ObjectRef, specs, the current-runtime slot

Public modules (``miniray/*.py``, ``miniray/util/``) import only ``core`` and the top layer
(``runtime``, ``api``, ``surface``); ``miniray.exceptions`` is a leaf that every layer may
import. Layers side by side (``host``/``transport``, ``object_store``/``ledger``,
``owner``/``worker``) may import each other, but without a cycle.

An import inside a function is for laziness only (the engine loads at ``init()``, not at
``import miniray``) and says so in a comment; it never hides a cycle. Where a lower layer
needs something a higher one sets up, the higher one installs it: ``runtime`` puts the
current runtime and its auto-init hook into ``core/context.py``.
"""


def __getattr__(name: str):
    """``ray._private.internal_api`` is reachable as an attribute in Ray; so it is here,
    loaded on first use like the package's other names."""
    if name == "internal_api":
        import importlib  # lazy: loads the state reader only when a program asks for it

        return importlib.import_module(f"{__name__}.internal_api")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
