"""The actor host: what a worker process becomes when it runs an actor.

Owns: constructing the actor instance, running its method calls (one at a time in submission
order, on a thread pool for ``max_concurrency > 1``, or on an asyncio event loop when any
method is ``async def``; with concurrency groups, on one executor per group: a thread pool of
the group's size, or an event loop thread of its own whose calls a ``CallLimit`` of that
size bounds, as Ray runs them), the built-in ``__ray_ready__``, ``__ray_call__`` and
``__ray_terminate__``, ``exit_actor()``, and cancelling calls (a queued one is skipped, a
running sync one flagged, an async one's coroutine cancelled); for a driver on another host
(``owner/remote_actors.py``), a call's large values sent as frames right after its RESULT
(``Channel.send_bulk``). Does not own: the worker's channel, output markers or environment
(``worker_main.py``), or anything the owner decides (restarts, death reasons).
Called by: ``worker_main._Worker`` when ACTOR_INIT arrives; afterwards the worker's main loop
hands every ACTOR_CALL here.

::

    ACTOR_INIT ──► cls.__new__ + cls.__init__ (an async actor: run on its loop, awaited there)
               ──► (ACTOR_READY, ok, error, times, repr_name)
    ACTOR_CALL ──► sync: run now, in order        ──► RESULT (in order)
               ├─► threads: its group's pool.submit ──► RESULT (as calls finish)
               └─► asyncio: a task on its group's loop (the calls read together
                       start with one wake-up)  ──► RESULT (those that end in one turn
                                                    of the loop: one write)
    __ray_terminate__ / exit_actor() ──► (ACTOR_EXITING, why), __ray_shutdown__, atexit
                                         handlers, exit 0 (no RESULT: the owner fails that
                                         call and the queued ones with ActorDiedError; with
                                         threads or asyncio, running calls finish first, and
                                         __ray_terminate__ also runs the calls sent before
                                         it, as Ray does for a threaded actor and for any
                                         actor whose last handle is gone)
    sys.exit() in __init__ or a method ──► __ray_shutdown__, atexit handlers, exit with its
        code: sys.exit(0) is an intended exit ((ACTOR_EXITING, why) first: no restart), any
        other code a crash (the owner restarts the actor while max_restarts allows)
    ray.kill / shutdown() ──► SIGKILL or EOF: neither __ray_shutdown__ nor atexit, as in Ray
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import inspect
import sys
import threading
from time import time_ns
from types import CoroutineType
from typing import NoReturn

from miniray._private.core import (
    concurrency_groups,
    descriptors,
    generator_returns,
    ids,
    protocol,
    scheduling,
)
from miniray._private.core.recent_ids import RecentIds
from miniray._private.core.task_spec import DYNAMIC, STREAMING, _ExitActor
from miniray._private.core.timeline_events import TIMES
from miniray._private.worker import streaming
from miniray._private.worker.execute import (
    _dumps_error,
    _flush_std,
    _user_traceback,
    exit_for_system_exit,
    is_retryable,
    result_message,
    task_error_for,
)
from miniray._private.worker.worker_api import TaskContext


class ActorContext:
    """What a running actor may ask about itself (``get_runtime_context()``)."""

    __slots__ = ("actor_id", "class_name", "name", "namespace", "handle_state", "restarts")

    def __init__(self, actor_id, class_name, name, namespace, handle_state, restarts=0):
        self.actor_id = actor_id
        self.class_name = class_name
        self.name = name
        self.namespace = namespace
        self.handle_state = handle_state
        self.restarts = restarts  # how many times the owner restarted this actor before


class CallLimit:
    """At most ``size`` calls of one concurrency group run at once on its loop; the others
    wait, in the order they came, as calls not started (no task yet): the turn a call gives
    back starts the next one then, so that its first step comes after what the ending call
    made ready. A coroutine it woke (an ``Event.set()``) runs first, as in Ray, which hands
    a call to the loop only when a turn is free (the actor-concurrency page's batch of 2
    runs in pairs there; started at once, the next call overtook the woken one and the
    batches drifted until one waited forever). Used on that loop's thread only.

    >>> limit = CallLimit(1)
    >>> limit.admit("a"), limit.admit("b"), limit.admit("c")
    (True, False, False)
    >>> limit.remove(lambda call: call == "c"), limit.release(), limit.release(), limit.free
    ('c', 'b', None, 1)
    """

    __slots__ = ("free", "waiting")

    def __init__(self, size: int):
        self.free = size
        self.waiting: collections.deque = collections.deque()

    def admit(self, call) -> bool:
        """True: ``call`` takes a free turn now; False: it waits for one (``release``)."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return True
        self.waiting.append(call)
        return False

    def release(self):
        """A call gave its turn back: the next call waiting, which takes it, or None."""
        if self.waiting:
            return self.waiting.popleft()  # the turn passes on: ``free`` does not change
        self.free += 1
        return None

    def remove(self, matches):
        """The first call waiting that ``matches``, taken out of the line, or None."""
        for call in self.waiting:
            if matches(call):
                self.waiting.remove(call)
                return call
        return None


class ActorHost:
    def __init__(self, worker, message: tuple):
        (_, actor_id, fn_id, class_name, args_blob, dep_values, ctx) = message
        (resources, gpu_ids, gpu_ints, max_concurrency, is_async, name, namespace,
         handle_state, restarts, groups, placement) = ctx
        self.worker = worker
        self.actor_id = actor_id
        self.class_name = class_name
        self.instance = None
        # (method, call name) -> (task name, Ray's function name): worked out once each (the
        # function name takes a few lookups, descriptors.method_name); cleared at 256 (call
        # names set per call)
        self.function_names: dict = {}
        self.exiting = False
        self.cancelled = RecentIds()
        # Async calls read and not yet ended: task id -> its asyncio task once started on
        # its loop (None before), what ``cancel()`` cancels; ``calls_ended`` is notified as
        # they end, for the exit paths that wait for the running calls.
        self.async_calls: dict[bytes, asyncio.Task | None] = {}
        # Per concurrency group of an async actor: calls read but not yet started on its loop.
        self.inboxes: collections.defaultdict = collections.defaultdict(list)
        self.replies: list = []  # results of async calls, written once per turn of a loop
        # Calls whose exceptions may be retried: task id -> their retry_exceptions (ACTOR_CALL's
        # last field), from their arrival until their result goes (``_send``, ``_reply_error``).
        self.retry_of: dict[bytes, object] = {}
        self.sending = threading.Lock()  # held while ``replies`` taken are being written
        self.lock = threading.Lock()
        # A driver on another host: a call's large values are sent as frames after its
        # RESULT (``worker_api.payload_for`` lists them in ``runtime.peer_out``); calls that
        # end together on threads or loops take that list one at a time.
        self.peer_lock = (worker.runtime.peer_lock if getattr(worker.channel, "remote", False)
                          else None)
        self.calls_ended = threading.Condition(self.lock)
        self.exit_waits = 0  # threads waiting on ``calls_ended`` (lock): notified only then
        self.leaving = threading.Lock()  # held by the one thread that ends the actor
        # Threaded sync actors: group -> its pool (the default group's key is None).
        self.pools: dict[str | None, concurrent.futures.ThreadPoolExecutor] = {}
        # Async actors: group -> (its event loop, the CallLimit bounding its calls).
        self.loops: dict[str | None, tuple] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # the default group's
        # method name -> (its class attribute, whether that is a coroutine or async
        # generator function); reading thread only. An attribute replaced on the class is
        # asked again (a bound classmethod equals the one before: not asked again).
        self.coroutines: dict = {}
        # Calls are sent while the constructor runs, and so are their cancels: from now on
        # the control thread hands them here (those already read are taken over).
        with worker.exec_lock:
            self.cancelled.update(worker.cancelled)
            worker.cancelled.clear()
            worker.actor_host = self
        worker._mark(class_name)
        worker._set_env(resources, gpu_ids)  # kept for the actor's whole life, as in Ray
        runtime = worker.runtime
        runtime.actor = ActorContext(actor_id, class_name, name, namespace, handle_state,
                                     restarts)
        runtime.actor_resources = resources
        runtime.actor_placement = placement  # its placement group, for its whole life
        runtime.actor_gpu_ids = (gpu_ids, gpu_ints)
        runtime.host = self
        if is_async:  # before the constructor: an ``async def __init__`` runs on this loop
            self.loop = _start_loop(concurrency_groups.DEFAULT)
        started = time_ns()  # the constructor's span on the timeline, as for a call
        error = self._construct(fn_id, args_blob, dep_values)
        runtime.task = None
        ended = time_ns()
        times = TIMES.pack(started, started, ended, ended)
        if error is not None:
            worker.channel.send((protocol.ACTOR_READY, actor_id, False, error, times, ""))
            worker.exit_process()
        # As in Ray 2.60, a class with its own __repr__ names the actor by it from now on
        # (its output's prefix, the state API's repr_name), as it is after the constructor.
        repr_name = custom_repr(self.instance)
        if repr_name:
            worker._mark(repr_name)
        sizes = concurrency_groups.executor_sizes(groups, max_concurrency)
        if is_async:
            for group, size in sizes.items():
                loop = self.loop if group is concurrency_groups.DEFAULT else _start_loop(group)
                self.loops[group] = (loop, CallLimit(size))
        elif groups or max_concurrency > 1:
            # With groups the default group gets a pool too (of one thread by default, which
            # keeps its calls in order): this thread must go on reading the calls of the
            # other groups while a call of the default group runs.
            for group, size in sizes.items():
                self.pools[group] = concurrent.futures.ThreadPoolExecutor(
                    size, thread_name_prefix=_thread_name("miniray-actor", group))
        worker.channel.send((protocol.ACTOR_READY, actor_id, True, None, times, repr_name))

    def _construct(self, fn_id, args_blob, dep_values) -> bytes | None:
        worker = self.worker
        try:
            cls = worker._function(fn_id)
            worker.runtime.task = self._creation_context(cls)
            args, kwargs = worker._load_args(args_blob, dep_values)
            instance = self.instance = cls.__new__(cls)  # the exit hooks may need it
            if self.loop is None:
                returned = cls.__init__(instance, *args, **kwargs)
            else:
                # As in Ray 2.60, an async actor's constructor runs on the loop its methods
                # run on, as a call there: ``asyncio.get_running_loop()`` and
                # ``create_task`` work in it, and (Python 3.9) the asyncio objects it makes
                # belong to that loop; an ``async def __init__`` is awaited there, before
                # any call.
                done = asyncio.run_coroutine_threadsafe(
                    _outcome(_construct_on_loop(cls, instance, args, kwargs)), self.loop)
                ok, returned = done.result()
                if not ok:
                    raise returned
            if returned is not None:
                print(f"Warning: {self.class_name}.__init__ returned a non-None value "
                      f"({returned!r}); the return value will be ignored.",
                      file=sys.stderr, flush=True)
            return None
        except BaseException as error:  # the constructor's error is every later call's error
            where = f"{self.class_name}.__init__"
            if _is_exit_actor(error):  # as in Ray: an intended exit, not a failed creation
                self._exit(f"exit_actor() was called in {where}.")
            if isinstance(error, SystemExit):
                if is_intended_exit(error):
                    self._say_exiting(error, where)
                exit_for_system_exit(error, where, before_exit=self._run_exit_hooks)
            task_error = task_error_for(
                error, f"{self.class_name}.__init__",
                task_id=ids.actor_creation_task_id(self.actor_id), pid=worker.pid,
                ip=worker.info.get("node_ip", "127.0.0.1"), actor_id=self.actor_id.hex(),
            )
            return _dumps_error(task_error)

    # -- calls ---------------------------------------------------------------------------
    def handle_call(self, message: tuple) -> None:
        task_id = message[1]
        method_name = message[2]
        if len(message) > 9 and message[9]:  # its exceptions may be retried: kept till it ends
            self.retry_of[task_id] = message[9]
        if method_name == "__ray_terminate__":
            self._terminate(message)
            return
        if (self.loop is not None or self.pools) and self._skip_if_cancelled(
                task_id, message[6]):
            return  # cancelled before it arrived: answered now, not once its turn comes
        group = message[8]
        if self.loop is not None:
            if group not in self.loops:
                self._reply_unknown_group(message)
                return
            loop, limit = self.loops[group]
            method = getattr(type(self.instance), method_name, None)
            known = self.coroutines.get(method_name)
            if known is not None and known[0] == method:
                coroutine = known[1]
            else:  # asked once per method (inspect's tests are ~10 calls)
                coroutine = (inspect.iscoroutinefunction(method)
                             or inspect.isasyncgenfunction(method))
                self.coroutines[method_name] = (method, coroutine)
            with self.lock:  # recorded before it can start or end: cancel() finds it
                self.async_calls[task_id] = None
                inbox = self.inboxes[group]
                inbox.append((message, coroutine, limit))
                wake = len(inbox) == 1
            if wake:  # one wake-up of the loop per batch of calls, not one per call
                loop.call_soon_threadsafe(self._start_calls, loop, inbox)
        elif self.pools:
            if self.exiting:  # the owner fails it once the process is gone
                return
            if group not in self.pools:
                self._reply_unknown_group(message)
                return
            self.pools[group].submit(self.run_call, message)
        elif group is not None:
            self._reply_unknown_group(message)
        else:
            self.run_call(message)

    def _start_calls(self, loop, inbox: list) -> None:
        """On ``loop``: the calls handed over since the last wake-up, in order: each that
        gets a turn (``CallLimit.admit``) starts as a task; the others wait for one."""
        with self.lock:
            calls = inbox[:]
            inbox.clear()
        run_async = self._run_async
        create_task = loop.create_task
        self._record(loop, [(call[0][1], create_task(run_async(*call)))
                            for call in calls if call[2].admit(call)])

    def _record(self, loop, tasks: list) -> None:
        """On ``loop``: the calls just started, ``(task_id, task)`` each, recorded for
        ``cancel()``; one cancelled before it got its task has it cancelled after its first
        step (which answers a call that never started)."""
        with self.lock:
            async_calls, cancelled = self.async_calls, self.cancelled
            for task_id, task in tasks:
                if task_id in async_calls:
                    async_calls[task_id] = task
                if task_id in cancelled:
                    loop.call_soon(task.cancel)

    def _cancel_waiting(self, limit: CallLimit, task_id: bytes) -> None:
        """On ``limit``'s loop (the only thread that touches it): a call cancelled while it
        waits there for a turn is answered now and leaves the line (it never runs)."""
        call = limit.remove(lambda waiting: waiting[0][1] == task_id)
        if call is not None:
            self._skip_if_cancelled(task_id, call[0][6])
            self._call_ended(task_id)

    def _reply_unknown_group(self, message: tuple) -> None:
        """The caller's handle checks the group of every call (``call_group``): a group the
        actor does not have is a bug in miniray, answered rather than run elsewhere."""
        from miniray.exceptions import RaySystemError

        self._reply_error(message[1], RaySystemError(
            f"The call of {self.class_name}.{message[7]} names concurrency group "
            f"{message[8]!r}, which this actor does not have. This is a bug in miniray."),
            message[7], message[6])

    async def _run_async(self, message: tuple, coroutine: bool, limit: CallLimit) -> None:
        """A call holding a turn of ``limit``: run it, then pass the turn on."""
        task_id = message[1]
        try:  # its first step always runs: ``_record`` cancels it after that step
            if coroutine:
                await self._call_coroutine(message)
            else:
                self.run_call(message)
        except asyncio.CancelledError:
            pass  # the call answered its cancel itself (``_call_coroutine``)
        finally:
            following = limit.release()
            if following is not None:  # its turn: it starts behind what is ready now
                loop = asyncio.get_running_loop()
                self._record(loop, [(following[0][1],
                                     loop.create_task(self._run_async(*following)))])
            self._call_ended(task_id)

    def _call_ended(self, task_id: bytes) -> None:
        with self.lock:
            self.async_calls.pop(task_id, None)
            self.cancelled.discard(task_id)
            if self.exit_waits:
                self.calls_ended.notify_all()

    async def _call_coroutine(self, message: tuple) -> None:
        (_, task_id, method_name, args_blob, dep_values, return_ids, num_returns,
         call_name) = message[:8]
        if self.exiting or self._skip_if_cancelled(task_id, num_returns):
            return
        worker = self.worker
        started = time_ns()
        try:
            args, kwargs = worker._load_args(args_blob, dep_values)
            worker.runtime.task = self._context(task_id, method_name, call_name)
            loaded = time_ns()
            result = self._method(method_name)(*args, **kwargs)
            if type(result) is CoroutineType or not inspect.isasyncgen(result):
                value = await result
            elif num_returns == STREAMING:
                await streaming.stream_async(worker, task_id, result,
                                             f"{self.class_name}.{call_name}",
                                             self._error_fields)
                value = None
            else:
                if num_returns == DYNAMIC:
                    value = streaming.dynamic(worker, task_id, await _replay(result),
                                              f"{self.class_name}.{call_name}",
                                              self._error_fields)
                else:  # N returns: Ray's rules
                    value = await generator_returns.take_async(result, num_returns)
        except asyncio.CancelledError:
            self._reply_cancelled_coroutine(task_id, call_name, num_returns)
            return
        except BaseException as error:
            self._reply_error(task_id, error, call_name, num_returns, (started,))
            return
        if self.is_cancelled(task_id):  # it caught the CancelledError: cancelled all the same
            self._reply_cancelled_coroutine(task_id, call_name, num_returns)
            return
        results, sers = self._serialize(value, num_returns, call_name, return_ids)
        if sers:  # a driver on another host: its bytes follow this RESULT, sent on its own
            with self.sending:
                _flush_std()
                self.worker.channel.send_bulk(result_message(
                    task_id, results, False, (started, loaded, time_ns())), sers)
            return
        with self.lock:  # sent once the calls that ran in this turn of the loop have run
            self.replies.append(result_message(task_id, results, False,
                                               (started, loaded, time_ns())))
            first = len(self.replies) == 1
        if first:
            asyncio.get_running_loop().call_soon(self._send_replies)

    def _send_replies(self) -> None:
        """The results of the async calls that ended since the last write, in one write (a
        burst of calls ends in one turn of the loop). A call's result is held here before
        the call counts as ended; the exit paths call this too, and ``sending`` makes them
        wait for a write in progress, so every result goes before ACTOR_EXITING."""
        with self.sending:
            with self.lock:
                replies = self.replies[:]
                self.replies.clear()
            if replies:
                _flush_std()
                self.worker.channel.send_many(replies)

    def _reply_cancelled_coroutine(self, task_id, call_name, num_returns) -> None:
        """Ray 2.60 cancels the coroutine's future: RayTaskError(TaskCancelledError), whatever
        the coroutine did with its CancelledError."""
        from miniray.exceptions import TaskCancelledError

        self._reply_error(task_id, TaskCancelledError(ids.TaskID(task_id)), call_name,
                          num_returns)

    def run_call(self, message: tuple) -> None:
        (_, task_id, method_name, args_blob, dep_values, return_ids, num_returns,
         call_name) = message[:8]
        if self.exiting:  # exit_actor() ran: the owner fails this call when we are gone
            return
        if self._skip_if_cancelled(task_id, num_returns):
            return
        worker = self.worker
        if method_name == "__ray_ready__":
            self._reply_value(task_id, True, num_returns, call_name, return_ids)
            return
        started = time_ns()
        try:
            args, kwargs = worker._load_args(args_blob, dep_values)
            worker.runtime.task = self._context(task_id, method_name, call_name)
            loaded = time_ns()
            value = self._method(method_name)(*args, **kwargs)
            if num_returns < 0:  # a generator: streamed, or its values stored one by one
                value = worker._run_generator(task_id, f"{self.class_name}.{call_name}",
                                              value, num_returns, self._error_fields)
            elif inspect.isgenerator(value):  # N returns: Ray's rules
                value = generator_returns.take(value, num_returns)
        except BaseException as error:
            if not self._ended_cancelled(task_id, num_returns, error):
                self._reply_error(task_id, error, call_name, num_returns, (started,))
            return
        finally:
            worker.runtime.task = None
        if not self._ended_cancelled(task_id, num_returns, None):
            self._reply_value(task_id, value, num_returns, call_name, return_ids,
                              (started, loaded, time_ns()))

    def _ended_cancelled(self, task_id: bytes, num_returns: int,
                         error: BaseException | None) -> bool:
        """A sync call has ended (``error`` None: it returned). If it was cancelled while it
        ran, send Ray's cancel error unless its own error stands, and say whether it did."""
        if self.loop is not None:  # a sync method of an async actor: cancelled as a coroutine
            return False
        with self.lock:
            if task_id not in self.cancelled:
                return False
            self.cancelled.discard(task_id)
        if scheduling.cancelled_call_outcome_stands(error):
            return False
        error = scheduling.actor_call_cancel_error(task_id)
        self._send(task_id, [(protocol.ERR, _dumps_error(error))] * max(1, num_returns))
        return True

    def _method(self, name: str):
        """The method ``name`` bound to the instance, found on its class first, as Ray does:
        an instance attribute of the same name (``self.flag = False`` beside ``def flag``)
        does not hide it, and static and class methods bind as Python binds them."""
        if name == "__ray_call__":  # built in, as Ray adds it to every actor class
            return self._ray_call
        cls = type(self.instance)
        try:
            member = static_member(cls, name)
        except AttributeError:
            return getattr(self.instance, name)  # e.g. served by a __getattr__
        binder = getattr(type(member), "__get__", None)
        if binder is None:
            return member  # a callable that is no descriptor: Python would not bind it either
        return binder(member, self.instance, cls)

    def _ray_call(self, fn, *args, **kwargs):
        """``handle.__ray_call__.remote(fn, *args, **kwargs)``: ``fn(instance, *args,
        **kwargs)`` run here, as a sync method of the actor (Ray 2.60's built-in)."""
        return fn(self.instance, *args, **kwargs)

    def _creation_context(self, cls) -> TaskContext:
        """The constructor's task, named as Ray 2.60 names it: ``Class.__init__`` (prefixed
        ``<name>:`` for a named actor), its id the actor's creation task id."""
        runtime = self.worker.runtime
        gpu_ids, gpu_ints = runtime.actor_gpu_ids
        call = f"{self.class_name}.__init__"
        name = runtime.actor.name
        return TaskContext(ids.actor_creation_task_id(self.actor_id),
                           f"{name}:{call}" if name else call,
                           descriptors.method_name(cls, "__init__"),
                           runtime.actor_resources, gpu_ids, gpu_ints)

    def _context(self, task_id, method_name, call_name):
        """Ray's names: the task is "Class.method" (or the .options(name=...) given), the
        function "module.Class.method"."""
        runtime = self.worker.runtime
        gpu_ids, gpu_ints = runtime.actor_gpu_ids
        names = self.function_names.get((method_name, call_name))
        if names is None:  # worked out once per method and call name
            if len(self.function_names) >= 256:
                self.function_names.clear()
            qualified = f"{self.class_name}.{method_name}"
            names = self.function_names[(method_name, call_name)] = (
                qualified if call_name == method_name else call_name,
                descriptors.method_name(type(self.instance), method_name))
        return TaskContext(task_id, names[0], names[1], runtime.actor_resources,
                           gpu_ids, gpu_ints)

    def _skip_if_cancelled(self, task_id: bytes, num_returns: int) -> bool:
        if not self.cancelled:  # the common case, read without the lock: a CANCEL that
            return False        # comes just after is found by the next test, as with it
        with self.lock:
            if task_id not in self.cancelled:
                return False
            self.cancelled.discard(task_id)
        error = scheduling.actor_call_cancel_error(task_id, self.actor_id)
        self._send(task_id, [(protocol.ERR, _dumps_error(error))] * max(1, num_returns))
        return True

    def _reply_value(self, task_id, value, num_returns, call_name, return_ids,
                     times: tuple | None = None) -> None:
        results, sers = self._serialize(value, num_returns, call_name, return_ids)
        self._send(task_id, results, times, sers)

    def _serialize(self, value, num_returns, call_name, return_ids) -> tuple:
        """The RESULT items of a call's value, and for a driver on another host the large
        values whose bytes follow RESULT (``Channel.send_bulk``), else None."""
        worker = self.worker
        name = f"{self.class_name}.{call_name}"
        if self.peer_lock is None:
            if value is None and num_returns == 1 and worker.none_inline:
                return [(protocol.OK, worker.none_payload, ())], None  # its first case
            return worker._serialize_returns(value, max(1, num_returns), name, return_ids,
                                             error_fields=self._error_fields), None
        with self.peer_lock:
            results = worker._serialize_returns(value, max(1, num_returns), name, return_ids,
                                                error_fields=self._error_fields)
            out = worker.runtime.peer_out
            sers = [out[item[1][2]] for item in results
                    if type(item[1]) is tuple and item[1][0] == "peer"]
            out.clear()
        return results, sers

    def _reply_error(self, task_id, error, call_name, num_returns,
                     times: tuple | None = None) -> None:

        if isinstance(error, _ExitActor):
            # As in Ray, the caller sees the actor's death (ActorDiedError), not a value: no
            # reply, and no call after this one may start.
            self.exiting = True
            why = f"exit_actor() was called in {self.class_name}.{call_name}."
            if not self.pools and self.loop is None:
                self._exit(why)
            # Threads or asyncio: the calls running now finish first, as in Ray; this
            # thread (or the loop) must go on for them, so another one waits.
            threading.Thread(target=self._exit_when_calls_end, args=(why,),
                             name="miniray-actor-exit", daemon=True).start()
            return
        if isinstance(error, SystemExit):  # the actor dies, as in Ray: no reply to this call
            self.exiting = True
            self._send_replies()  # the async calls that ended before it keep their results
            where = f"{self.class_name}.{call_name}"
            if is_intended_exit(error):
                self._say_exiting(error, where)
            exit_for_system_exit(error, where, before_exit=self._run_exit_hooks)
        worker = self.worker
        task_error = task_error_for(
            error, f"{self.class_name}.{call_name}", task_id=task_id, pid=worker.pid,
            ip=worker.info.get("node_ip", "127.0.0.1"), actor_id=self.actor_id.hex(),
            actor_repr=_safe_repr(self.instance),
        )
        if times is not None:  # it ran until now: loaded and returned are not told apart
            times = (times[0], times[0], time_ns())
        self._send(task_id, [(protocol.ERR, _dumps_error(task_error))] * max(1, num_returns),
                   times, retryable=is_retryable(error, self.retry_of.get(task_id)))

    def _error_fields(self) -> dict:
        return {"actor_id": self.actor_id.hex(), "actor_repr": _safe_repr(self.instance)}

    def _send(self, task_id: bytes, results: list, times: tuple | None = None,
              sers: list | None = None, retryable: bool = False) -> None:
        _flush_std()
        if self.retry_of:
            self.retry_of.pop(task_id, None)
        if sers:
            self.worker.channel.send_bulk(result_message(task_id, results, retryable, times),
                                          sers)
            return
        self.worker.channel.send(result_message(task_id, results, retryable, times))

    # -- cancel and exit ----------------------------------------------------------------
    def cancel(self, task_id: bytes) -> None:
        """From the control thread: a queued call is skipped, a running sync one flagged
        (``is_canceled()``; the owner ends its waits), an async one's coroutine cancelled."""
        with self.lock:
            self.cancelled.add(task_id)
            task = self.async_calls.get(task_id, False)
        if task:
            task.get_loop().call_soon_threadsafe(task.cancel)
        elif task is None and self.loop is not None:  # read, not started: maybe waiting for
            for loop, limit in self.loops.values():  # a turn (else ``_record`` sees it)
                loop.call_soon_threadsafe(self._cancel_waiting, limit, task_id)

    def flag_cancelled(self, task_id: bytes) -> None:
        """A wait of this running sync call was answered CANCELLED (maybe before the control
        socket's CANCEL was read): the call is cancelled."""
        with self.lock:
            self.cancelled.add(task_id)

    def is_cancelled(self, task_id: bytes) -> bool:
        if not self.cancelled:  # as in ``_skip_if_cancelled``: no lock for the common case
            return False
        with self.lock:
            return task_id in self.cancelled

    def _terminate(self, message: tuple) -> None:
        # The calls sent before this one run to their end first, in every group, whether
        # they run yet or wait for a turn: a threaded actor's (queued in its pools ahead of
        # it, as in Ray) and an async one's (read before it). ``exiting`` stays unset (it
        # is what makes exit_actor() skip the calls not started yet). This is how an actor
        # whose last handle is gone ends (the owner's ``__ray_terminate__``): in Ray 2.60
        # the calls submitted before the handle went all return their values. As in Ray,
        # the call itself gets ActorDiedError: no reply.
        self._exit_when_calls_end(f"__ray_terminate__ was called on {self.class_name} "
                                  "(directly, or because its handles were all gone).")

    def _exit_when_calls_end(self, why: str) -> None:
        if self.pools:
            for pool in self.pools.values():
                pool.shutdown(wait=True)
        else:
            self._wait_async_calls()
        self._exit(why)

    def _wait_async_calls(self) -> None:
        """Block until the async calls read so far have ended (not those read later)."""
        with self.lock:
            pending = set(self.async_calls)
            self.exit_waits += 1
            try:
                self.calls_ended.wait_for(lambda: pending.isdisjoint(self.async_calls))
            finally:
                self.exit_waits -= 1

    def _exit(self, why: str) -> NoReturn:
        """The intended end: tell the owner (no restart; ``why`` is in every pending call's
        ActorDiedError), run the hooks, leave."""
        self._send_replies()  # results of async calls that ended, if any are still held
        self.worker.channel.send((protocol.ACTOR_EXITING, why))
        self._run_exit_hooks()
        self.worker.exit_process()

    def _say_exiting(self, error: SystemExit, where: str) -> None:
        """``sys.exit(0)``: Ray's intended exit (no restart), before the process goes."""
        self.worker.channel.send((protocol.ACTOR_EXITING,
                                  f"sys.exit({error.code!r}) was called in {where}."))

    def _run_exit_hooks(self) -> None:
        """Ray's orderly end of an actor: its ``__ray_shutdown__`` (if it has one), then the
        process's ``atexit`` handlers. Runs once; a second thread that gets here waits for
        the first to end the process."""
        if not self.leaving.acquire(blocking=False):
            threading.Event().wait()  # the process exits under this thread
        _flush_std()
        hook = getattr(type(self.instance), "__ray_shutdown__", None)
        if hook is not None:
            try:
                result = self._method("__ray_shutdown__")()
                if inspect.iscoroutine(result):
                    _run_coroutine_apart(result)
            except BaseException as error:  # the actor ends anyway, as in Ray
                print("Error during actor __ray_shutdown__ method (the actor exits "
                      f"anyway)\n{_user_traceback(error)}", file=sys.stderr, end="")
        # The worker leaves with os._exit, which skips these: run them as an interpreter
        # exit would (exceptions are printed by atexit itself).
        atexit._run_exitfuncs()
        _flush_std()


def static_member(cls: type, name: str):
    """``inspect.getattr_static(cls, name)``, the same answer at a fraction of its cost per
    call: where ``cls`` and the classes of its MRO up to the one holding ``name`` are plain
    classes (their metaclass ``type``), the first class dict holding ``name`` is the answer,
    as ``getattr_static`` finds it; anything else (another metaclass on the way, a name on
    no class) is asked of ``getattr_static`` itself."""
    if type(cls) is type:
        for entry in cls.__mro__:
            if type(entry) is not type:
                break
            namespace = entry.__dict__
            if name in namespace:
                return namespace[name]
    return inspect.getattr_static(cls, name)


def _thread_name(prefix: str, group: str | None) -> str:
    return prefix if group is concurrency_groups.DEFAULT else f"{prefix}-{group}"


def _start_loop(group: str | None) -> asyncio.AbstractEventLoop:
    """A new event loop, run forever by a daemon thread of its own (one per group)."""
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()

    threading.Thread(target=run, name=_thread_name("miniray-actor-loop", group),
                     daemon=True).start()
    return loop


async def _replay(agen):
    """A generator giving what async generator ``agen`` gave, then raising what it raised
    (a cancel or an exit is raised here at once): its values for ``streaming.dynamic``."""
    values = []
    try:
        async for item in agen:
            values.append(item)
    except Exception as error:  # noqa: BLE001 - raised again after the values
        failure = error
    else:
        failure = None

    def replay():
        yield from values
        if failure is not None:
            raise failure

    return replay()


async def _construct_on_loop(cls, instance, args: tuple, kwargs: dict):
    """An async actor's ``cls.__init__``, called on its loop (awaited if ``async def``)."""
    returned = cls.__init__(instance, *args, **kwargs)
    if inspect.iscoroutine(returned):
        returned = await returned
    return returned


async def _outcome(coroutine) -> tuple:
    """``(True, value)`` or ``(False, error)``: a SystemExit (``exit_actor()``) raised in
    the coroutine must not escape into the event loop, which it would stop."""
    try:
        return True, await coroutine
    except BaseException as error:
        return False, error


def _run_coroutine_apart(coroutine) -> None:
    """Run an ``async def __ray_shutdown__`` to its end on an event loop of its own, in a
    thread of its own (the caller may be the actor's loop thread, which cannot wait on
    itself)."""
    thread = threading.Thread(target=asyncio.run, args=(coroutine,),
                              name="miniray-actor-shutdown", daemon=True)
    thread.start()
    thread.join()


def _is_exit_actor(error: BaseException) -> bool:
    return isinstance(error, _ExitActor)


def is_intended_exit(error: SystemExit) -> bool:
    """Ray's rule: ``sys.exit(0)`` (or False) is an intended exit and the actor is not
    restarted; any other code, None included, is a crash (restarted while allowed)."""
    return isinstance(error.code, int) and error.code == 0  # bools are ints


def custom_repr(instance) -> str:
    """The name an actor goes by once constructed: ``repr(instance)`` (on one line) when
    its class or a base class defines ``__repr__``, as Ray 2.60 uses it; "" otherwise, and
    when that ``__repr__`` raises or gives no string (Ray's actor dies of it; here it keeps
    its class name).

    >>> class A:
    ...     def __repr__(self):
    ...         return "A(1)"
    >>> class B(A):
    ...     pass
    >>> class Broken:
    ...     def __repr__(self):
    ...         raise ValueError
    >>> [custom_repr(c()) for c in (A, B, Broken, object)]
    ['A(1)', 'A(1)', '', '']
    """
    if type(instance).__repr__ is object.__repr__:
        return ""
    try:
        text = repr(instance)
    except Exception:  # noqa: BLE001 - the class name stays
        return ""
    return " ".join(text.splitlines()) if isinstance(text, str) else ""


def _safe_repr(instance) -> str:
    try:
        return repr(instance)
    except Exception:
        return f"<{type(instance).__name__} object>"

