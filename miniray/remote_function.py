"""RemoteFunction: what ``@miniray.remote`` makes of a function.

Mirrors ``ray.remote_function.RemoteFunction`` (Ray 2.60): ``.remote()``, ``.options()``,
``_default_options``, ``_max_calls``; calling it directly raises TypeError; ``.remote()``
checks the arguments against the function's signature (``_private/core/signatures.py``); a
generator function streams its values (``ObjectRefGenerator``), or with ``num_returns="dynamic"``
(deprecated, with Ray's warning) returns a ``DynamicObjectRefGenerator``; ``.bind()`` gives a
``ray.dag`` FunctionNode (``miniray/dag/``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Generic

from miniray._private import runtime  # installs the auto-init hook .remote() uses
from miniray._private.api import ObjectRefGenerator
from miniray._private.core import (
    context,
    descriptors,
    generator_returns,
    ids,
    object_ref,
    placement,
    runtime_envs,
    serialization,
    signatures,
)
from miniray._private.core import options as _options
from miniray._private.core.object_ref import ObjectRef
from miniray._private.core.task_spec import DYNAMIC, STREAMING, TaskSpec
from miniray._private.core.type_vars import P, R
from miniray.util.annotations import RayDeprecationWarning

__all__ = ["RemoteFunction", "STREAMING_GENERATOR_RETURN"]

# Ray's public constant: the ``num_returns`` a streaming generator task carries.
STREAMING_GENERATOR_RETURN = STREAMING

# Bumped in a forked child: a function's export is made again there (its cache is keyed by
# this, which costs no system call per task as the pid did).
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def warn_if_dynamic(num_returns, stacklevel: int) -> None:
    """Ray's deprecation warning for ``num_returns="dynamic"``, at ``@remote``,
    ``.options()`` and ``@method``."""
    if num_returns == "dynamic":
        warnings.warn(DYNAMIC_NUM_RETURNS_WARNING, RayDeprecationWarning,
                      stacklevel=stacklevel + 1)


DYNAMIC_NUM_RETURNS_WARNING = (
    "num_returns='dynamic' is deprecated and will be removed in a future Ray release. "
    "Use num_returns='streaming' instead."
)


def warm_up() -> tuple:
    """``init()``, once its workers are ready, once per warm-up round
    (``runtime.WARM_UP_ROUNDS``): decorate and export a throwaway no-op of a
    script's ``__main__`` (its signature, options, template and pickle by value), as a
    program's first ``@remote`` and ``.remote()`` do, so that those of the program pay no
    first run of that code (0.5 ms less for both together here, for 0.5 ms in ``init()``;
    run alone, without round trips, more runs cost more and gave no more; with them, see
    ``WARM_UP_ROUNDS``); and the process's first task id and TaskSpec
    (their first runs took ~25 µs of the first ``.remote()``, ~5 µs once made). Nothing is
    submitted or kept. Returns the TaskSpec and the function's pickle for ``init()``'s
    warm-up round trip (``OwnerEvents.warm_up_round_trip``): its name is None, the name no
    worker has yet (no output marker), and its id is one no task will have."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def warm_up():\n    return None\n", namespace)  # noqa: S102 (constant text)
    function: RemoteFunction[[], None] = RemoteFunction(namespace["warm_up"], {})
    template = _Template(function._default_options, function._max_calls, "warm_up", False)
    fn_id, fn_bytes = function._export(None)
    task_id = ids.new_task_id()
    blob, deps, contained = _NO_ARGUMENTS
    spec = TaskSpec(task_id, fn_id, None, None, function._descriptor_name, blob, deps,
                    [task_id + _FIRST_RETURN], template.num_returns, template.request,
                    template.max_retries, template.retry_exceptions, template.max_calls,
                    contained, "", None)
    return spec, fn_bytes


runtime.WARM_UPS.append(warm_up)


# What pack_arguments() gives a call without arguments, and the suffix of a task's first
# return id: the common no-argument, one-return submission computes neither per task.
_NO_ARGUMENTS = serialization.pack_arguments((), {}, "", ObjectRef)[:3]
_FIRST_RETURN = (1).to_bytes(4, "big")


_NO_OPTIONS: tuple = ()


def _no_options() -> tuple:
    """``(request, placement, affinity)`` of a task without options. One request dict for
    every such function (nothing changes a request once made), so the owner's cache of
    scheduling keys, which is keyed by the dict, knows a new function's at once."""
    global _NO_OPTIONS
    if not _NO_OPTIONS:
        _NO_OPTIONS = (_options.task_resource_request({}), _options.placement_option({}),
                       _options.task_strategy({}))
    return _NO_OPTIONS


class _Template:
    """Everything ``.remote()`` needs that depends only on the options (computed once)."""

    __slots__ = ("request", "num_returns", "max_retries", "retry_exceptions",
                 "max_calls", "name", "runtime_env", "env_cache", "placement", "placed",
                 "follows_caller", "affinity")

    def __init__(self, opts: dict, max_calls: int, default_name: str, is_generator: bool):
        if opts:
            self.request = _options.task_resource_request(opts)
            # The placement group the options name ("default": the caller's, if it captures)
            self.placement = _options.placement_option(opts)
            # A NodeAffinitySchedulingStrategy's (node_id, soft, on_unavailable), or
            # "SPREAD" (the owner places it: owner/remote_nodes.py).
            self.affinity = _options.task_strategy(opts)
        else:  # a bare @remote: the answers for no options, made once (_no_options)
            self.request, self.placement, self.affinity = _no_options()
        self.placed: tuple = (None, None, None)  # (target, request, ctx) of the last
        # It names no group: it goes to the caller's, only if the caller is in one
        # (``placement.resolve_option``), and no further when the caller is in none.
        self.follows_caller = (self.placement is not None
                               and isinstance(self.placement[0], str))
        num_returns = opts.get("num_returns")
        if is_generator and num_returns in (None, "streaming"):
            num_returns = STREAMING
        elif is_generator and num_returns == "dynamic":
            num_returns = DYNAMIC
        elif num_returns is None:
            num_returns = 1
        self.num_returns = num_returns
        max_retries = opts.get("max_retries")
        self.max_retries = _options.default_max_retries() if max_retries is None else max_retries
        self.retry_exceptions = _options.wire_retry_exceptions(opts.get("retry_exceptions"))
        self.max_calls = max_calls
        self.name = opts.get("name") or default_name
        self.runtime_env = runtime_envs.parse_for_task(opts.get("runtime_env"))
        self.env_cache: tuple = (None, "")  # (session token, env_key) of the last .remote()

    def env_key(self, rt) -> str:
        """The environment a submission runs in (``runtime_envs.submission_key``), computed
        once per session."""
        token, key = self.env_cache
        if token is not rt.session_token:
            key = runtime_envs.submission_key(rt, self.runtime_env)
            self.env_cache = (rt.session_token, key)
        return key

    def request_in(self, rt, function_name: str) -> tuple[dict, tuple | None]:
        """The request and placement-group context of a submission (``placement.place``):
        the options' group, or the caller's when it captures child tasks."""
        placed = self.placement
        if placed is None:
            return self.request, None
        target = placement.resolve_option(placed, rt.current_placement())
        if target is None:
            return self.request, None
        cached = self.placed
        if cached[0] == target:
            return cached[1], cached[2]
        pg_hex, bundles, index, capture = target
        request, ctx = placement.place(self.request, pg_hex, bundles, index, capture,
                                       function_name)
        self.placed = (target, request, ctx)
        return request, ctx


class RemoteFunction(Generic[P, R]):
    """A remote function. Call ``.remote(*args, **kwargs)`` to run it as a task.

    Typed as Ray's: for ``def add(a: int, b: int) -> int``, ``add.remote`` takes what ``add``
    takes and returns ``ObjectRef[int]``.

    Example:
        >>> @ray.remote
        ... def add(a, b):
        ...     return a + b
        >>> ray.get(add.remote(1, 2))
        3
    """

    if TYPE_CHECKING:  # at run time, an attribute set in __init__ (it keeps the signature)

        def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]: ...

    def __init__(self, function: Callable[P, R], options: dict) -> None:
        _options.check_remote_args((function,), {})
        self._is_generator = inspect.isgeneratorfunction(function)
        _options.validate_task_options(options, in_options=False,
                                       is_generator=self._is_generator)
        warn_if_dynamic(options.get("num_returns"), stacklevel=4)  # the @remote line
        self._function = function
        # Ray's two names: "module.f" in messages, and for get_task_function_name() the
        # same with __main__ named after its file (neither has a "<locals>" segment).
        self._function_name = f"{function.__module__}.{function.__name__}"
        self._descriptor_name = descriptors.function_name(function)
        # Checked at every .remote(), as Ray does: a bad call fails here, not in the worker.
        self._argspec = signatures.of_function(function, function.__name__)
        self._default_options = dict(options)
        self._max_calls = _options.default_max_calls(options)
        self._export_cache: tuple | None = None
        self._sent: tuple = (None, None)  # (session token, function id) last submitted
        self._template: _Template | None = None
        functools.update_wrapper(self, function, updated=())
        # .remote keeps the function's signature and docstring, as in Ray; it calls
        # ``_submit`` itself (``_remote_default`` inlined: one call less per task)
        submit = self._submit
        make_template = self._remote_default

        @functools.wraps(function)
        def remote(*args, **kwargs):
            template = self._template
            if template is None:
                return make_template(*args, **kwargs)
            return submit(template, args, kwargs)

        self.remote = remote  # type: ignore[method-assign]

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "Remote functions cannot be called directly. Instead of running "
            f"'{self._function_name}()', try '{self._function_name}.remote()'."
        )

    def options(self, **task_options: Any) -> _FunctionOptions[P, R]:
        """A copy with ``task_options`` merged over the decorator's; ``.remote()`` runs it."""
        if "max_calls" in task_options:
            raise ValueError("Setting 'max_calls' is not supported in '.options()'.")
        merged = _options.update_options(self._default_options, task_options)
        _options.validate_task_options(
            merged, in_options=True,
            is_generator=self._is_generator if "num_returns" in task_options else None,
        )
        warn_if_dynamic(task_options.get("num_returns"), stacklevel=2)
        return _FunctionOptions(self, merged)

    def _remote(self, args=None, kwargs=None, **task_options: Any):
        """Ray's lower-level form: ``f._remote(args=[...], kwargs={...}, num_returns=2)`` is
        ``f.options(num_returns=2).remote(*args, **kwargs)``."""
        target = self.options(**task_options) if task_options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def bind(self, *args, **kwargs):
        """A DAG node of this task with these arguments (``ray.dag``); ``.execute()`` runs it."""
        # lazy: ray.dag loads on the first .bind(), as in Ray (import miniray stays lean)
        from miniray.dag.function_node import FunctionNode

        return FunctionNode(self, args, kwargs, dict(self._default_options))

    # -- submission -----------------------------------------------------------------
    def _remote_default(self, *args, **kwargs):
        template = self._template
        if template is None:
            template = self._template = _Template(
                self._default_options, self._max_calls, self._function.__name__,
                self._is_generator)
        return self._submit(template, args, kwargs)

    def _export(self, collect: int | None) -> tuple[bytes, bytes]:
        """The function's id and pickle; ``collect``: the number of returns a generator
        function's values are taken for in the worker (``generator_returns.collect``),
        None for any other call."""
        cache = self._export_cache
        if cache is None or cache[0] != _forks:
            cache = self._export_cache = (_forks, {})
        exported = cache[1].get(collect)
        if exported is None:
            target = self._function
            if collect is not None:
                target = functools.partial(generator_returns.collect, collect, target)
            data = serialization.dumps_function(target, self._function_name)
            serialization.check_function_size(data, self._function_name, "remote function")
            exported = cache[1][collect] = (hashlib.sha1(data).digest()[:16], data)
        return exported

    def _submit(self, template: _Template, args: tuple, kwargs: dict):
        argspec = self._argspec  # check()'s first test inlined: a plain call binds
        if argspec is not None and (kwargs or len(args) not in argspec.plain_counts):
            argspec.check(args, kwargs)
        rt = context.auto_init()  # the runtime (``runtime.auto_init`` starts one if none)
        token = rt.session_token
        num_returns = template.num_returns
        collect = num_returns if self._is_generator and num_returns >= 0 else None
        cache = self._export_cache  # _export(), inlined for a function exported already
        exported = cache[1].get(collect) if cache is not None and cache[0] == _forks else None
        fn_id, fn_data = exported if exported is not None else self._export(collect)
        # The function's pickle goes with the first submission in a session only; once one
        # went through, the runtime is not asked again (its answer cannot change back).
        sent = self._sent
        if (sent[0] is token and sent[1] == fn_id) or not rt.needs_function(fn_id):
            fn_data = None
        # ``_stored``: refs of large arguments put in the store, alive until submitted.
        if args or kwargs:
            blob, deps, contained, _stored = serialization.pack_arguments(
                args, kwargs, self._function_name, ObjectRef, rt.large_arguments)
        else:
            blob, deps, contained = _NO_ARGUMENTS
        task_id = ids.new_task_id()
        if num_returns == 1 or num_returns < 0:  # one return id (a generator's included)
            return_ids = [task_id + _FIRST_RETURN]
        else:
            return_ids = [task_id + i.to_bytes(4, "big") for i in range(1, num_returns + 1)]
        placed = template.placement
        # request_in(), inlined for the common cases: no group, or the caller's group when it
        # captures, and the caller (the driver, say) is in none
        if placed is None or (template.follows_caller and rt.current_placement() is None):
            request, pg_ctx = template.request, None
        else:
            request, pg_ctx = template.request_in(rt, self._function.__qualname__)
        env_token, env_key = template.env_cache  # env_key(), inlined for the common case
        if env_token is not token:
            env_key = template.env_key(rt)
        spec = TaskSpec(
            task_id, fn_id, fn_data, template.name,
            self._descriptor_name, blob, deps, return_ids, num_returns, request,
            template.max_retries, template.retry_exceptions, template.max_calls, contained,
            env_key, pg_ctx,
        )
        if template.affinity is not None:
            spec.affinity = template.affinity
        rt.submit_task(spec)
        if sent[0] is not token or sent[1] != fn_id:
            self._sent = (token, fn_id)
        if num_returns == 1 or num_returns == DYNAMIC:
            return object_ref.owned_ref(return_ids[0], rt)
        if num_returns == STREAMING:
            return ObjectRefGenerator(object_ref.owned_ref(return_ids[0], rt))
        if num_returns == 0:
            return None
        return [ObjectRef(object_id) for object_id in return_ids]

    def __repr__(self) -> str:
        return f"<miniray.remote_function.RemoteFunction {self._function_name}>"


class _FunctionOptions(Generic[P, R]):
    """What ``RemoteFunction.options()`` returns: only ``.remote()`` and ``.bind()``."""

    def __init__(self, remote_function: RemoteFunction[P, R], opts: dict) -> None:
        self._remote_function = remote_function
        self._options = opts
        self._template: _Template | None = None

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]:
        template = self._template
        if template is None:
            function = self._remote_function
            template = self._template = _Template(
                self._options, function._max_calls, function._function.__name__,
                function._is_generator)
        return self._remote_function._submit(template, args, kwargs)

    def bind(self, *args, **kwargs):
        """A DAG node of this task with these options and arguments (``ray.dag``)."""
        # lazy: ray.dag loads on the first .bind(), as in Ray (import miniray stays lean)
        from miniray.dag.function_node import FunctionNode

        return FunctionNode(self._remote_function, args, kwargs, dict(self._options))
