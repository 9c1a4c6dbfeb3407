"""Actors: ``@remote`` on a class gives an ActorClass; ``.remote()`` gives an ActorHandle.

Mirrors ``ray.actor`` (Ray 2.60): ``ActorClass`` (``remote``, ``options``; calling it or
subclassing it raises), ``ActorHandle`` (method attributes, hashable, picklable, repr
``Actor(Cls, <id>)``), ``ActorMethod`` (``remote``, ``options``), ``exit_actor``, ``method``
(``ray.method``), and the built-in ``__ray_ready__`` / ``__ray_terminate__`` /
``__ray_call__`` (``fn(actor, *args, **kwargs)`` run on the actor); ``.remote()`` of
a class or a method checks the arguments against its signature (carried in the handle).
A handle's class is a subclass of ActorHandle with a property per method (``_handle_class``);
a method looked up on a handle keeps that handle (and so the actor) alive, as in Ray; the
handle keeps no method, only each method's fixed part (``_MethodSpec``), so dropping its last
handle ends an actor at once, by reference count, with no cycle for the GC to find.
Differs: an actor that names resources but not ``num_cpus`` holds no CPU (see
``miniray/_private/owner/actors.py``); a bad ``concurrency_groups`` value, or a call naming a
group the class does not define, raises at once (``_private/core/concurrency_groups.py``).
``.bind()`` gives ``ray.dag`` nodes (``miniray/dag/``). A generator method (sync, or async
in an async actor) streams its values as a generator function does (``ObjectRefGenerator``).

Example:
    >>> @ray.remote
    ... class Counter:
    ...     def __init__(self):
    ...         self.value = 0
    ...     def increment(self):
    ...         self.value += 1
    ...         return self.value
    >>> counter = Counter.remote()
    >>> ray.get(counter.increment.remote())
    1
"""

from __future__ import annotations

import hashlib
import inspect
import os
from typing import Any, Generic

from miniray._private import runtime
from miniray._private.api import ObjectRefGenerator
from miniray._private.core import (
    concurrency_groups,
    context,
    ids,
    runtime_envs,
    serialization,
    signatures,
)
from miniray._private.core import options as _options
from miniray._private.core import placement as _placement
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.task_spec import (
    DYNAMIC,
    STREAMING,
    ActorCallSpec,
    ActorCreationSpec,
    _ExitActor,
)
from miniray._private.core.type_vars import T
from miniray.remote_function import warn_if_dynamic

__all__ = ["ActorClass", "ActorClassInheritanceException", "ActorHandle", "ActorMethod",
           "DEFAULT_MAX_CONCURRENCY_ASYNC", "STREAMING_GENERATOR_RETURN", "exit_actor", "method"]

# Ray's public constants: an async actor's default ``max_concurrency``, and the
# ``num_returns`` a streaming generator call carries.
DEFAULT_MAX_CONCURRENCY_ASYNC = 1000
STREAMING_GENERATOR_RETURN = STREAMING

_BUILTIN_METHODS = ("__ray_ready__", "__ray_terminate__", "__ray_call__")


def _ray_call(fn, *args, **kwargs):
    """The parameters of the built-in ``__ray_call__`` (run on the actor by its host)."""

_new_method = object.__new__  # ActorHandle.__getattr__ makes an ActorMethod without __init__


class ActorClassInheritanceException(TypeError):
    """Raised when a class tries to inherit from an ActorClass."""


def _method_table(cls: type) -> dict:
    """name -> (num_returns, is_generator, max_task_retries or None, ArgSpec or None,
    concurrency group or None, retry_exceptions) for every method. The table travels inside
    handles, so every handle checks calls and names their group."""
    table = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("__") and name.endswith("__"):
            continue
        function = member
        if not (inspect.isfunction(function) or inspect.ismethod(function)):
            continue
        # As in Ray, static and class methods are called through handles too; their bound
        # form (what getmembers gives) takes no self, so nothing is dropped from it.
        bound = isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod))
        generator = inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(
            function)
        num_returns = _wire_returns(getattr(function, "__ray_num_returns__", None), generator)
        argspec = signatures.of_function(function, f"{cls.__name__}.{name}",
                                         drop_first=not bound)
        table[name] = (num_returns, generator,
                       getattr(function, "__ray_max_task_retries__", None), argspec,
                       getattr(function, "__ray_concurrency_group__", None),
                       _options.wire_retry_exceptions(
                           getattr(function, "__ray_retry_exceptions__", False)))
    for name in _BUILTIN_METHODS:  # in the default group, as in Ray
        table[name] = (1, False, 0, signatures.ArgSpec((), f"{name}()", name), None)
    table["__ray_call__"] = (1, False, 0, signatures.of_function(_ray_call, "__ray_call__"),
                             None)
    return table


def _wire_returns(num_returns, generator: bool) -> int:
    """``num_returns`` as a call carries it: a generator's ``None``/``"streaming"`` is
    STREAMING, its ``"dynamic"`` DYNAMIC; a plain method's None is 1."""
    if generator and num_returns in (None, "streaming"):
        return STREAMING
    if generator and num_returns == "dynamic":
        return DYNAMIC
    return 1 if num_returns is None else num_returns


def _is_async(cls: type) -> bool:
    return any(inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
               for _, m in inspect.getmembers(cls, inspect.isfunction))


class ActorClass(Generic[T]):
    """What ``@remote`` makes of a class. Create actors with ``.remote(*args)``.

    A type checker sees ``@remote`` on ``class Counter`` as ``ActorClass[Counter]``, whose
    ``.remote()`` returns ``ActorHandle[Counter]``.
    """

    def __init__(self, cls: type[T], options: dict) -> None:
        _options.validate_actor_options(options, in_options=False)
        self._cls = cls
        self._default_options = dict(options)
        self._is_async = _is_async(cls)
        self._methods = _method_table(cls)
        self._argspec = signatures.of_class(cls, cls.__name__)
        self._export_cache: tuple | None = None
        self.__ray_metadata__ = {"class_name": cls.__name__, "methods": sorted(self._methods)}
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "Actors cannot be instantiated directly. Instead of "
            f"'{self._cls.__name__}()', use '{self._cls.__name__}.remote()'.")

    def __mro_entries__(self, bases):
        # The subclass's name is known only once its class is made: a stand-in base refuses
        # it then, with Ray's words.
        actor_name = self._cls.__name__

        def refuse(subclass, **_kwargs):
            raise ActorClassInheritanceException(
                f"Attempted to define subclass '{subclass.__name__}' of actor class "
                f"'{actor_name}'. Inheriting from actor classes is not currently supported. "
                "You can instead inherit from a non-actor base class and make the derived "
                "class an actor class (with @ray.remote).")

        return (type(f"ActorClass({actor_name})", (),
                     {"__init_subclass__": classmethod(refuse)}),)

    def __getattr__(self, name: str) -> Any:
        """The class's own attributes, as Ray's actor class has them: constants
        (``Counter.LIMIT``), static and class methods, methods (the plain functions). Only
        names the normal lookup did not find come here."""
        cls = self.__dict__.get("_cls")  # absent while unpickling: no recursion
        if cls is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"'ActorClass' object has no attribute '{name}'")
        try:
            return getattr(cls, name)
        except AttributeError:
            raise AttributeError(
                f"'ActorClass({cls.__name__})' object has no attribute '{name}'") from None

    def __dir__(self):
        own = object.__dir__(self)
        return sorted(set(own) | {n for n in dir(self._cls)
                                  if not (n.startswith("__") and n.endswith("__"))})

    def __repr__(self) -> str:
        return f"<{self._cls.__module__}.ActorClass({self._cls.__name__}) object at {id(self):#x}>"

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle[T]:
        return self._create(args, kwargs, self._default_options)

    def options(self, **actor_options: Any) -> _ActorClassOptions[T]:
        if "concurrency_groups" in actor_options:
            raise ValueError("Setting 'concurrency_groups' is not supported in '.options()'.")
        merged = _options.update_options(self._default_options, actor_options)
        _options.validate_actor_options(merged, in_options=True)
        return _ActorClassOptions(self, merged)

    def bind(self, *args, **kwargs):
        """A DAG node creating this actor (``ray.dag.ClassNode``) at each ``execute()``."""
        # lazy: ray.dag loads on the first .bind(), as in Ray (import miniray stays lean)
        from miniray.dag.class_node import ClassNode

        return ClassNode(self, args, kwargs, dict(self._default_options))

    def _export(self) -> tuple[bytes, bytes]:
        cache = self._export_cache
        if cache is None or cache[0] != os.getpid():
            name = f"{self._cls.__module__}.{self._cls.__qualname__}.__init__"  # as Ray
            data = serialization.dumps_function(self._cls, name, "actor class")
            serialization.check_function_size(data, self._cls.__name__, "actor")
            cache = self._export_cache = (os.getpid(), hashlib.sha1(data).digest()[:16], data)
        return cache[1], cache[2]

    def _remote(self, args=None, kwargs=None, **actor_options: Any) -> ActorHandle[T]:
        """Ray's lower-level form: ``A._remote(args=[...], kwargs={...}, num_cpus=1)`` is
        ``A.options(num_cpus=1).remote(*args, **kwargs)``."""
        target = self.options(**actor_options) if actor_options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def _create(self, args: tuple, kwargs: dict, opts: dict) -> ActorHandle[T]:
        if self._argspec is not None:
            self._argspec.check(args, kwargs)  # as Ray: a bad call fails now, not in the actor
        groups = self._concurrency_groups()  # before init: a bad class starts nothing
        rt = runtime.auto_init()
        _options.actor_creation_checks(opts, is_async=self._is_async)
        placement, held = _options.actor_resource_requests(opts)
        if opts.get("num_cpus") is None:
            held.pop("CPU", None)  # holds what it names (module docstring of actors.py)
        pg_ctx = None
        target = _placement.resolve_option(_options.placement_option(opts),
                                           rt.current_placement())
        if target is not None:
            hex_, bundles, index, capture = target
            placement, pg_ctx = _placement.place(placement, hex_, bundles, index, capture,
                                                 self._cls.__qualname__)  # as Ray names it
            held = _placement.rewrite_request(held, hex_, index)
        max_concurrency = opts.get("max_concurrency") or (
            DEFAULT_MAX_CONCURRENCY_ASYNC if self._is_async else 1)
        fn_id, data = self._export()
        # ``_stored``: refs of large arguments put in the store, alive until submitted.
        blob, deps, contained, _stored = serialization.pack_arguments(
            args, kwargs, f"{self._cls.__module__}.{self._cls.__qualname__}.__init__",
            ObjectRef, rt.large_arguments)
        namespace = opts.get("namespace")
        if namespace is None:
            namespace = rt.namespace if rt.mode == "driver" else rt.info.get("namespace")
        max_task_retries = opts.get("max_task_retries") or 0
        state = (self._cls.__name__, self._methods, max_task_retries, tuple(groups))
        spec = ActorCreationSpec(
            actor_id=ids.new_actor_id(), fn_id=fn_id,
            fn_bytes=data if rt.needs_function(fn_id) else None,
            class_name=self._cls.__name__, args_blob=blob, deps=deps,
            placement=placement, held=held, max_restarts=opts.get("max_restarts") or 0,
            max_task_retries=max_task_retries, max_concurrency=max_concurrency,
            is_async=self._is_async, name=opts.get("name"), namespace=namespace,
            detached=opts.get("lifetime") == "detached",
            get_if_exists=bool(opts.get("get_if_exists")), handle_state=state,
            max_pending_calls=opts.get("max_pending_calls"), contained=contained,
            concurrency_groups=groups or None,
            runtime_env=runtime_envs.submission_key(
                rt, runtime_envs.parse_for_task(opts.get("runtime_env"))),
            pg=pg_ctx,
            affinity=_options.task_strategy(opts),  # a node's, SPREAD: owner/remote_actors.py
            out_of_order=bool(self._is_async or max_concurrency > 1
                              or opts.get("allow_out_of_order_execution")),
        )
        actor_id = rt.create_actor(spec)
        return ActorHandle(actor_id, state)


    def _concurrency_groups(self) -> dict[str, int]:
        """The class's groups, checked as Ray checks them: when an actor is created."""
        name = self._cls.__name__
        groups = concurrency_groups.check_groups(
            self._default_options.get("concurrency_groups"), name)
        concurrency_groups.check_method_groups(
            {method: meta[4] for method, meta in self._methods.items()}, groups, name)
        return groups


class _ActorClassOptions(Generic[T]):
    """What ``ActorClass.options()`` returns: only ``.remote()`` and ``.bind()``."""

    def __init__(self, actor_class: ActorClass[T], opts: dict) -> None:
        self._actor_class = actor_class
        self._options = opts

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle[T]:
        return self._actor_class._create(args, kwargs, self._options)

    def bind(self, *args, **kwargs):
        """A DAG node creating this actor with these options (``ray.dag.ClassNode``)."""
        # lazy: ray.dag loads on the first .bind(), as in Ray (import miniray stays lean)
        from miniray.dag.class_node import ClassNode

        return ClassNode(self._actor_class, args, kwargs, dict(self._options))


class ActorHandle(Generic[T]):
    """A handle to an actor: call its methods with ``handle.method.remote(...)``.

    ``T`` is the actor's class, for type checkers; its methods are looked up at run time.
    """

    def __new__(cls, actor_id: bytes = b"", state: tuple = ()):
        # A handle is made of a subclass with one property per method (_handle_class): a
        # method is then found on the type at once, without the failed lookup that ends in
        # __getattr__ (about 0.2 us against 0.6 us per call).
        if cls is ActorHandle and state:
            cls = _handle_class(state[1])
        return object.__new__(cls)

    def __init__(self, actor_id: bytes, state: tuple):
        self._actor_id = actor_id
        self._state = state
        self._specs: dict[str, _MethodSpec] = {}  # method name -> spec (see __getattr__)
        tracker = context.current()
        self._token = tracker.session_token if tracker is not None else None
        if tracker is not None:
            tracker.actor_handle_event(actor_id, 1)

    def __del__(self):
        tracker = context.current()
        if tracker is not None and self._token is tracker.session_token:
            try:
                tracker.actor_handle_event(self._actor_id, -1)
            except Exception:  # interpreter shutdown
                pass

    def __reduce__(self):
        tracker = context.current()
        if tracker is not None and self._token is tracker.session_token:
            tracker.actor_handle_event(self._actor_id, 0)
        return (ActorHandle, (self._actor_id, self._state))

    def __getattr__(self, name: str) -> ActorMethod:
        # Reached for a method only when its property (_handle_class) is shadowed or missed.
        # A method's fixed part (_MethodSpec) is built once per handle and name and kept in
        # ``_specs``, which holds no handle; each lookup binds it to this handle in a fresh
        # two-slot ActorMethod. Caching bound methods instead would make a cycle
        # (handle -> method -> handle) and an actor would then end at the next GC pass, not
        # when its last handle goes.
        try:
            spec = self.__dict__["_specs"][name]
        except KeyError:
            spec = None
        if spec is None:  # outside the except: an unknown name's error carries no KeyError
            spec = self._method_spec(name)
        method = _new_method(ActorMethod)
        method._handle = self
        method._spec = spec
        return method

    def __dir__(self):
        """The actor's methods, as Ray lists a handle's: its class's (``__init__`` and the
        built-in ``__ray_*__`` ones included), not the handle's own machinery."""
        return sorted({"__init__", *self._state[1]}) if self._state else []

    def _method_spec(self, name: str) -> _MethodSpec:
        """The spec of method ``name`` (AttributeError if the actor has none), cached."""
        if name.startswith("_") and name not in _BUILTIN_METHODS and name not in self._state[1]:
            raise AttributeError(f"'ActorHandle' object has no attribute '{name}'")
        meta = self._state[1].get(name)
        if meta is None:
            raise AttributeError(f"'ActorHandle' object has no attribute '{name}'")
        spec = _MethodSpec(name, meta[0], meta[1], meta[2], name,
                           meta[3] if len(meta) > 3 else None,
                           meta[4] if len(meta) > 4 else None, None,
                           meta[5] if len(meta) > 5 else False)
        specs = self.__dict__.get("_specs")
        if specs is None:  # a handle made without __init__ (copy, a subclass): no cache
            return spec
        specs[name] = spec
        return spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)

    def __repr__(self) -> str:
        return f"Actor({self._state[0]}, {self._actor_id.hex()})"

    def _actor_id_hex(self) -> str:
        return self._actor_id.hex()

    def _kill(self, no_restart: bool = True) -> None:
        rt = runtime.auto_init()
        self._check_session(rt)
        rt.kill_actor(self._actor_id, no_restart)

    def _check_session(self, rt) -> None:
        if self._token is not None and self._token is not rt.session_token:
            if rt.mode == "driver":
                from miniray.exceptions import ActorHandleNotFoundError

                raise ActorHandleNotFoundError(
                    f"The actor {self._actor_id.hex()} belongs to a session that was shut "
                    "down; create it again in this session.")

    def _submit(self, spec: _MethodSpec, args: tuple, kwargs: dict) -> Any:
        rt = context.auto_init()  # the runtime (``runtime.auto_init`` starts one if none)
        if self._token is not None and self._token is not rt.session_token:
            raise Exception(
                f"Failed to submit task to actor {self._actor_id.hex()}: its handle belongs "
                "to a session that was shut down.")
        # ``_stored``: refs of large arguments put in the store, alive until submitted.
        blob, deps, contained, _stored = serialization.pack_arguments(
            args, kwargs, self._state[0] + "." + spec.name, ObjectRef,
            rt.large_arguments if args or kwargs else None)  # a call without any: none
        task_id = ids.new_actor_task_id(self._actor_id)  # TaskID.actor_id() names the actor
        num_returns = spec.num_returns
        if num_returns == 1:  # the common call: one return, no list of refs to build
            return_ids = [ids.object_id_for(task_id, 1)]
        else:
            count = 1 if num_returns < 0 else num_returns  # a generator's: one return id
            return_ids = [ids.object_id_for(task_id, i) for i in range(1, count + 1)]
        max_task_retries = spec.max_task_retries
        if max_task_retries is None:
            max_task_retries = self._state[2]
        rt.submit_actor_call(self._actor_id, ActorCallSpec(
            task_id, spec.name, blob, deps, return_ids, num_returns, spec.call_name,
            max_task_retries, contained, concurrency_group=spec.group,
            retry_exceptions=spec.retry_exceptions if max_task_retries else False))
        if num_returns == 1:
            return ObjectRef(return_ids[0])
        if not return_ids:
            return None
        refs = [ObjectRef(object_id) for object_id in return_ids]
        if num_returns == STREAMING:
            return ObjectRefGenerator(refs[0])
        return refs[0] if len(refs) == 1 else refs


# The attributes a handle sets on itself: a method of one of these names stays hidden, as
# it was behind them before (no property for it; __getattr__ is never asked).
_HANDLE_FIELDS = frozenset({"_actor_id", "_state", "_specs", "_token"})
# frozenset of method names -> the ActorHandle subclass with a property for each of them.
_HANDLE_CLASSES: dict[frozenset, type] = {}


def _handle_class(methods: dict) -> type:
    """The ActorHandle subclass for an actor with the methods ``methods`` (a handle state's
    table): one property per method that the handle's own attributes do not shadow, each
    binding the handle's spec as ``__getattr__`` does. Named and placed as ActorHandle (its
    repr, pickling by ``__reduce__``); one class per set of names, made once."""
    key = frozenset(methods)
    cls = _HANDLE_CLASSES.get(key)
    if cls is None:
        namespace: dict[str, Any] = {"__module__": ActorHandle.__module__,
                                     "__qualname__": "ActorHandle",
                                     "__doc__": ActorHandle.__doc__}
        for name in key:
            if name not in _HANDLE_FIELDS and not hasattr(ActorHandle, name):
                namespace[name] = _method_property(name)
        cls = _HANDLE_CLASSES.setdefault(key, type("ActorHandle", (ActorHandle,), namespace))
    return cls


def _method_property(name: str) -> property:
    def method(self: ActorHandle) -> ActorMethod:
        spec = self._specs.get(name)
        if spec is None:
            spec = self._method_spec(name)
        bound = _new_method(ActorMethod)
        bound._handle = self
        bound._spec = spec
        return bound

    method.__name__ = method.__qualname__ = name
    return property(method, doc=f"The actor's method {name!r}: call ``.remote(...)``.")


class _MethodSpec:
    """What an ActorMethod calls, apart from its handle: fixed once built, shared by every
    ActorMethod of one handle and name (``ActorHandle.__getattr__``); ``options()`` makes a
    new one."""

    __slots__ = ("name", "num_returns", "generator", "max_task_retries", "call_name",
                 "argspec", "concurrency_group", "group_override", "group", "retry_exceptions")

    def __init__(self, name: str, num_returns: int, generator: bool, max_task_retries,
                 call_name: str, argspec, concurrency_group: str | None,
                 group_override: str | None, retry_exceptions=False) -> None:
        self.name = name
        self.num_returns = num_returns
        self.generator = generator
        self.max_task_retries = max_task_retries
        self.call_name = call_name  # the calls' name: .options(name=...), else ``name``
        self.argspec = argspec
        self.concurrency_group = concurrency_group  # the method's (@method), None: default
        self.group_override = group_override  # the call's .options(concurrency_group=...)
        self.group = group_override or concurrency_group  # the one the calls name
        # Which exceptions the method raises are retried (``wire_retry_exceptions``), while
        # max_task_retries allows, as a task's with its max_retries.
        self.retry_exceptions = retry_exceptions


class ActorMethod:
    """A method of an actor handle. Run it with ``.remote(*args, **kwargs)``.

    It holds its handle (so the actor lives while the method is kept, as in Ray) and its
    ``_MethodSpec``; the old attribute names (``_name``, ``_num_returns``, ...) read the spec.
    """

    __slots__ = ("_handle", "_spec")

    def __init__(self, handle: ActorHandle, name: str, num_returns: int, generator: bool,
                 max_task_retries, call_name: str | None = None, *, argspec=None,
                 concurrency_group: str | None = None, group_override: str | None = None,
                 retry_exceptions=False):
        self._handle = handle
        self._spec = _MethodSpec(name, num_returns, generator, max_task_retries,
                                 call_name or name, argspec, concurrency_group, group_override,
                                 retry_exceptions)

    _name = property(lambda self: self._spec.name)
    _num_returns = property(lambda self: self._spec.num_returns)
    _generator = property(lambda self: self._spec.generator)
    _max_task_retries = property(lambda self: self._spec.max_task_retries)
    _call_name = property(lambda self: self._spec.call_name)
    _argspec = property(lambda self: self._spec.argspec)
    _concurrency_group = property(lambda self: self._spec.concurrency_group)
    _group_override = property(lambda self: self._spec.group_override)

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "Actor methods cannot be called directly. Instead of running "
            f"'object.{self._name}()', try 'object.{self._name}.remote()'.")

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        spec = self._spec
        argspec = spec.argspec  # check()'s first test inlined: a plain call binds
        if argspec is not None and (kwargs or len(args) not in argspec.plain_counts):
            argspec.check(args, kwargs)
        return self._handle._submit(spec, args, kwargs)

    def _remote(self, args=None, kwargs=None, **opts: Any) -> Any:
        """Ray's lower-level form: ``m._remote(args=[...], kwargs={...}, num_returns=2)``
        is ``m.options(num_returns=2).remote(*args, **kwargs)`` (options left None are not
        given)."""
        opts = {key: value for key, value in opts.items() if value is not None}
        if opts.get("name") == "":
            del opts["name"]
        target = self.options(**opts) if opts else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def options(self, **opts) -> ActorMethod:
        allowed = {"name", "num_returns", "max_task_retries", "retry_exceptions",
                   "concurrency_group", "enable_task_events", "tensor_transport", "_labels"}
        unknown = sorted(set(opts) - allowed)
        if unknown:
            raise ValueError(f"Invalid option keyword {unknown[0]} for actor methods. "
                             f"Valid ones are {sorted(allowed)}.")
        _options.validate_method_call_options(opts, is_generator=self._generator)
        num_returns = self._num_returns
        if "num_returns" in opts:
            warn_if_dynamic(opts["num_returns"], stacklevel=2)
            num_returns = _wire_returns(opts["num_returns"], self._generator)
        state = self._handle._state
        override = opts.get("concurrency_group", self._group_override)
        concurrency_groups.call_group(self._concurrency_group, override,
                                      state[3] if len(state) > 3 else (), state[0], self._name)
        return ActorMethod(self._handle, self._name, num_returns, self._generator,
                           opts.get("max_task_retries", self._max_task_retries),
                           opts.get("name") or self._call_name, argspec=self._argspec,
                           concurrency_group=self._concurrency_group,
                           group_override=override or None,
                           retry_exceptions=_options.wire_retry_exceptions(opts["retry_exceptions"])
                           if "retry_exceptions" in opts else self._spec.retry_exceptions)

    def bind(self, *args, **kwargs):
        """A DAG node calling this method of this live actor (``ray.dag.ClassMethodNode``;
        a tuple of nodes, one per value, for ``num_returns > 1``)."""
        # lazy: ray.dag loads on the first .bind(), as in Ray (import miniray stays lean)
        from miniray.dag.class_node import bind_on_handle

        return bind_on_handle(self, args, kwargs)


def make_actor_class(cls: type[T], options: dict) -> ActorClass[T]:
    return ActorClass(cls, options)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The handle of the live actor named ``name`` in ``namespace`` (default: the current)."""
    # Ray 2.60's types: TypeError for a name or namespace that is not a string ("expected
    # bytes, int found"), ValueError for an empty name. These messages name the argument.
    if not isinstance(name, str):
        raise TypeError(
            f"get_actor() expects the actor's name as a str, got {type(name).__name__} "
            f"{name!r}. Pass the name given with .options(name=...)."
        )
    if not name:
        raise ValueError("Please supply a non-empty value to get_actor")
    if namespace is not None and not isinstance(namespace, str):
        raise TypeError(
            f"namespace must be None or a string, got {type(namespace).__name__} {namespace!r}."
        )
    rt = runtime.auto_init()
    actor_id, state = rt.get_actor(name, namespace)
    return ActorHandle(actor_id, state)


def exit_actor() -> None:
    """End the current actor on purpose, as Ray's ``exit_actor``: this call's caller and the
    calls queued behind it get ``ActorDiedError``; with threads or asyncio, the calls already
    running finish first. The actor's ``__ray_shutdown__`` and ``atexit`` handlers run, and it
    is never restarted.

    Raises:
        TypeError: outside an actor.
    """
    rt = runtime.current()
    if rt is None or rt.mode != "worker" or rt.actor is None:
        raise TypeError("exit_actor API is called on a non-actor worker.")
    raise _ExitActor(0)


for _cls in (ActorClass, ActorHandle, ActorMethod, ActorClassInheritanceException):
    _cls.__module__ = "miniray.actor"


def method(*args, **kwargs):
    """Sets options of one actor method (``num_returns``, ``max_task_retries``, ...).

    Mirrors ``ray.method`` (``ray.actor.method``, the same function).

    Example:
        >>> @ray.remote
        ... class Splitter:
        ...     @ray.method(num_returns=2)
        ...     def halves(self, items):
        ...         middle = len(items) // 2
        ...         return items[:middle], items[middle:]
        >>> first, second = Splitter.remote().halves.remote([1, 2, 3, 4])
        >>> ray.get(first), ray.get(second)
        ([1, 2], [3, 4])
    """
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    if args:
        raise AssertionError(
            "The @ray.method decorator must be applied using no arguments or at least one of "
            f"the arguments in the list {sorted(_options.METHOD_OPTIONS)}, for example "
            "'@ray.method(num_returns=2)'."
        )
    _options.validate_method_options(kwargs)

    def decorator(function):
        warn_if_dynamic(kwargs.get("num_returns"), stacklevel=2)  # the @method line
        for key, value in kwargs.items():
            setattr(function, f"__ray_{key}__", value)
        function.__ray_method_options__ = dict(kwargs)
        return function

    return decorator
