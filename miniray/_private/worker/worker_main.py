"""The worker process: receive tasks on the data socket, run them, send results.

Owns: the worker's main loop, running one task (arguments in, results or the error out, output
markers, CUDA_VISIBLE_DEVICES), and cancelling the running task on request. Does not own: what
the public API does inside a task (``worker_api.py``), or which tasks come here (the owner).
Called by: the fork server, in the forked child (``run_forked``), which first applies the
runtime environment HELLO names and the job's LoggingConfig (``core/logging_config.py``),
and runs the job's setup hook (``runtime_env_setup.py``).

::

    data socket ──► main thread: HELLO (answered READY), then FUNC / TASK / EXIT
                      ──► RESULT ──► data socket
    control socket ──► "miniray-cancel" thread: CANCEL(task_id)
                         → KeyboardInterrupt raised in the main thread if that task is running
                           (as Ray does; not while it talks to the owner: then it is raised
                           when that exchange ends, and a get()/wait() is answered CANCELLED),
                           and CANCEL_WAKE_SIGNAL sent to the main thread, so that a blocking
                           call (time.sleep, a read, a lock) ends with it at once
                         → an actor call: ActorHost.cancel (a flag, a skip, or asyncio)
                       RECALL → GIVE_BACK of the tasks received but not started

A worker exits on EOF from its data socket, and with the fork server (PR_SET_PDEATHSIG), and
when user code calls ``sys.exit()`` (as a Ray worker does; the owner sees a crash). Errors
sent back: ``task_error_for`` (arguments that fail to unpickle become Ray's
``RayTaskError(RaySystemError)``), ``_serialize_returns`` (results that cannot be pickled).
A worker for a driver on another host (``run_forked(..., remote)``, from its node's fork
server) reads and writes its data and control connections as MAC'd frames
(``peer_channel.FramedPeer``: checked before unpickling; a bad frame ends the worker), takes
its node's session, node id and shm dir over the driver's HELLO; a large argument's bytes
follow TASK and a large result's follow RESULT on the data connection
(``worker_api.Channel._receive_bulk`` and ``send_bulk``): nothing of the driver's store is
mapped; its fds 1 and 2 are TCP connections to the driver, plain bytes.
Output: fds 1 and 2 are pipes to the owner. Before a task whose name differs from the last one,
the worker writes a marker line ``\\x00mr:<pid>:<name>`` on both, which the owner turns into the
``(<name> pid=<pid>)`` prefix, unless the owner named that task already: a TASK sent to an idle
worker is preceded by ``(NAMED, name)`` when the owner switched the prefix itself
(``WorkerSlot.name_output``), and the worker then takes ``name`` as its last one. Two pipe
writes less, and no wake-up of the owner's I/O thread, on the first task of a new name.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import pickle
import select
import signal
import socket
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from time import monotonic, time_ns
from typing import TYPE_CHECKING

from miniray._private.core import (
    alias,
    config,
    context,
    ids,
    logging_config,
    oob,
    protocol,
    runtime_envs,
    serialization,
)
from miniray._private.core.generator_returns import GeneratorReturns
from miniray._private.core.recent_ids import RecentIds
from miniray._private.core.task_spec import STREAMING
from miniray._private.host import serializer_file, worker_logs
from miniray._private.object_store import values
from miniray._private.transport.framing import FramedSocket
from miniray._private.worker import execute, runtime_env_setup, streaming
from miniray._private.worker.execute import (
    ArgumentsNotLoaded,
    _dumps_error,
    _flush_std,
    _user_traceback,
    exit_for_system_exit,
    is_retryable,
    result_message,
    task_error_for,
)
from miniray._private.worker.worker_api import Channel, TaskContext, WorkerRuntime, _current_task

if TYPE_CHECKING:
    pass

MARKER = b"\x00mr:"
# Sent by the control thread to the main thread with a cancel's KeyboardInterrupt: it ends
# the blocking call the task is in with EINTR, and Python, running the handler (which does
# nothing), raises the pending KeyboardInterrupt there. Ray's cancel waits for the call to
# return (README, Differences).
CANCEL_WAKE_SIGNAL = signal.SIGUSR2


def _wake_for_cancel(signum, frame) -> None:
    """CANCEL_WAKE_SIGNAL's handler: nothing to do (see there)."""


# What ``payload_for`` makes of a returned None (the plain pickle: no buffers, no refs
# inside), made once: a no-op task's result costs no pickler.
_NONE_PAYLOAD = oob.inline_blob(oob.serialize(None))
# The process environment as bytes (CPython's os.environ on POSIX keeps it in ``_data``;
# None elsewhere, and os.environ.get is used): read per task by ``_set_env``.
_ENVIRON_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
# The args blob of a call with no arguments, as ``pack_arguments`` makes it: not unpickled.
_NO_ARGS_BLOB = serialization.pack_arguments((), {}, "", type(None))[0]



def split_returns(value, num_returns: int) -> list:
    """The ``num_returns`` objects a task's return value stands for.

    Ray's rules and types: more than one return needs a sequence of exactly that length
    (ValueError "Task returned 3 objects, but num_returns=2."); a value without a length is
    a TypeError, which here says what was returned and what was expected (Ray's says only
    "object of type 'int' has no len()").

    Example:
        >>> split_returns((1, 2), 2)
        [1, 2]
    """
    if num_returns == 1:
        return [value]
    if num_returns == 0:
        return []
    try:
        count = len(value)
    except TypeError:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise TypeError(
            f"Task returned {type(value).__name__} {shown}, but num_returns={num_returns} "
            f"expects a sequence of {num_returns} values (e.g. a tuple). Return "
            f"{num_returns} values, or use num_returns=1 to return this object as it is."
        ) from None
    if count != num_returns:
        raise ValueError(f"Task returned {count} objects, but num_returns={num_returns}.")
    return list(value)

class _Worker:
    def __init__(self, channel: Channel, ctl: Connection, info: dict):
        self.channel = channel
        self.ctl = ctl
        self.info = info
        self.pid = os.getpid()
        self.runtime = WorkerRuntime(channel, info)
        self.functions: dict[bytes, object] = {}
        self.last_name: str | None = None
        self.exec_lock = self.runtime.cancel_lock  # also guards the runtime's wait records
        self.current: bytes | None = None
        self.cancelled = RecentIds()  # ids whose CANCEL came while they were not running
        self.injected = False
        self.main_ident = threading.get_ident()
        signal.signal(CANCEL_WAKE_SIGNAL, _wake_for_cancel)  # made in the main thread
        self.user_set_omp = "OMP_NUM_THREADS" in os.environ
        self.base_cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.noset_cvd = config.noset_cuda_visible_devices()
        self.cvd_on_zero = config.override_cvd_on_zero()
        self.env_for: dict | None = None  # the resources _set_env last applied, when exact
        self.omp_now: bytes | None = None  # and the OMP_NUM_THREADS it left (None: not its)
        self.actor_host = None
        # A returned None is sent inline (``_NONE_PAYLOAD``) unless the store's inline
        # threshold is below its size (then it goes through ``payload_for`` as any value).
        self.none_inline = len(_NONE_PAYLOAD) < info.get("store", {}).get("inline_threshold", 0)
        self.none_payload = _NONE_PAYLOAD  # for the actor host's async calls
        capacity = info.get("store", {}).get("capacity", 1 << 30)
        self.mappings = values.MappingCache(max(256 << 20, capacity // 4))
        self.runtime.mappings = self.mappings
        self.serializers = serializer_file.SerializerFileWatch(info.get("session_dir", ""))
        self.ctl_done = threading.Condition(threading.Lock())
        self.ctl_handled = 0  # control messages handled so far (_await_control)
        self.ctl_read = 0  # and read so far
        self.ctl_closed = False
        self.ctl_poller = select.poll()  # is a control message waiting? (no read)
        self.ctl_poller.register(ctl.fileno(), select.POLLIN)

    # -- control thread ---------------------------------------------------------
    def start_control_thread(self) -> None:
        thread = threading.Thread(target=self._control_loop, name="miniray-cancel", daemon=True)
        thread.start()

    def _control_loop(self) -> None:
        readable = select.poll()
        readable.register(self.ctl.fileno(), select.POLLIN)
        while True:
            # Counted as read before it leaves the pipe: were it counted after, the main
            # loop could look in between (nothing waiting in the pipe, read == handled) and
            # start the very task this message cancels.
            try:
                readable.poll()
            except InterruptedError:
                continue
            with self.ctl_done:  # read, not yet handled: _await_control waits for it
                self.ctl_read += 1
            try:
                data = self.ctl.recv_bytes()
            except (EOFError, OSError):
                with self.ctl_done:
                    self.ctl_closed = True
                    self.ctl_done.notify_all()
                return
            try:
                message = pickle.loads(data)
                self._on_control(message)
            finally:
                with self.ctl_done:  # for _await_control: this message is handled
                    self.ctl_handled += 1
                    self.ctl_done.notify_all()

    def _on_control(self, message: tuple) -> None:
        runtime = self.runtime
        if message[0] == protocol.RECALL:
            if self.actor_host is None:
                self.channel.give_back_waiting()
            return
        if message[0] == protocol.COLLECT:  # the store is filling up (owner/store_gc.py)
            gc.collect()
            self.channel.flush()  # the refs the collection dropped, reported now
            return
        if message[0] != protocol.CANCEL:
            return
        task_id = message[1]
        if self.actor_host is not None:  # actor calls are never interrupted, as in Ray
            gate = config.test_actor_cancel_gate()
            if gate is not None:
                _wait_for_file(gate, 60.0)
            self.actor_host.cancel(task_id)
            return
        with self.exec_lock:
            if self.current == task_id and task_id in runtime.canceled:
                pass  # a get() or wait() of the task already raised it
            elif self.current == task_id:
                runtime.canceled.add(task_id)
                if self.main_ident in runtime.waiting:  # raised when the exchange ends
                    runtime.missed.add(self.main_ident)
                else:
                    # Ray interrupts a running task with KeyboardInterrupt (so that
                    # ``except Exception`` in the task does not swallow it).
                    self.injected = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.main_ident), ctypes.py_object(KeyboardInterrupt)
                    )
                    # Seen at the next bytecode only: a task in a blocking call (sleep,
                    # read, select, a lock) is woken, and its handler's first bytecode
                    # raises it there (tests/integration/test_cancel.py).
                    signal.pthread_kill(self.main_ident, CANCEL_WAKE_SIGNAL)
            else:
                self.cancelled.add(task_id)

    def _await_control(self, timeout: float = 0.5) -> None:
        """Before a task starts: every control message already arrived (the cancel of a task
        pipelined here, say) is handled first, so a task cancelled before it started never
        runs however late the control thread is scheduled. Every one, not only the first:
        a RECALL may come just before the CANCEL. At most ``timeout`` in all."""
        if self.ctl_read == self.ctl_handled and not self.ctl_poller.poll(0):
            return  # the common case, without the lock: nothing read or waiting
        deadline = None
        while True:
            with self.ctl_done:
                if self.ctl_closed:
                    return
                seen = self.ctl_handled
                pending = self.ctl_read != seen  # read by the control thread, not handled
            if not pending and not self.ctl_poller.poll(0):
                return
            now = monotonic()
            if deadline is None:
                deadline = now + timeout
            elif now >= deadline:
                return
            with self.ctl_done:  # seen was taken before the poll: no handling is missed
                self.ctl_done.wait_for(
                    lambda seen=seen: self.ctl_handled != seen or self.ctl_closed,
                    deadline - now)

    # -- main loop ------------------------------------------------------------------
    def loop(self) -> None:
        channel = self.channel
        while True:
            # Refs the last task dropped: reported before going idle (flush()'s own first
            # test made here: usually there are none).
            pending = channel.before_send_pending
            if pending is None or pending:
                channel.flush()
            message = channel.next_message()
            tag = message[0]
            if tag == protocol.TASK:
                self.run_task(message)
            elif tag == protocol.ACTOR_CALL:
                self.actor_host.handle_call(message)
            elif tag == protocol.FUNC:
                self.functions[message[1]] = message[2]
            elif tag == protocol.NAMED:  # the driver prefixes the next task's output itself
                self.last_name = message[1]
            elif tag == protocol.UNMAP:
                self.mappings.drop(message[1])
            elif tag == protocol.SERIALIZERS:
                self.serializers.notify()
            elif tag == protocol.ACTOR_INIT:
                # lazy: only a worker that becomes an actor loads the actor host (and asyncio)
                from miniray._private.worker.actor_host import ActorHost

                # Before the constructor runs, so its output is found by the actor's id.
                worker_logs.note_actor(self.info.get("session_dir", ""), message[1].hex(),
                                       os.getpid())
                self.actor_host = ActorHost(self, message)
            elif tag == protocol.EXIT:
                return

    def exit_process(self) -> None:
        """Leave now: flush what was printed and recorded, then exit without atexit hooks."""
        _flush_std()
        execute.flush_metrics()
        os._exit(0)

    def _load_args(self, args_blob: bytes, dep_values) -> tuple:
        """The call's arguments; ``ArgumentsNotLoaded`` if one cannot be read or unpickled.
        First, the driver's custom serializers, if they changed since the last call."""
        if self.serializers.stale:  # changed() looks only after a notice
            blob = self.serializers.changed()
            if blob is not None:
                serialization.apply_registrations(blob)
        if not dep_values and args_blob == _NO_ARGS_BLOB:
            return (), {}
        try:
            args, kwargs = serialization.loads_arguments(args_blob)  # arrays: read-only
            if dep_values:
                args = list(args)
                for position, _kind, data in dep_values:
                    if type(data) is tuple and data[0] == "peer":  # from another host
                        value = oob.load_segment(memoryview(data[1]).toreadonly(),
                                                 "an argument from the driver")
                    else:
                        value = values.read(data, self.mappings)  # arrays: read-only views
                    if isinstance(position, int):
                        args[position] = value
                    else:
                        kwargs[position] = value
        except Exception as error:  # user __reduce__/__setstate__ code may raise anything
            raise ArgumentsNotLoaded(error) from None
        return args, kwargs

    def _function(self, fn_id: bytes):
        function = self.functions[fn_id]
        if isinstance(function, bytes):
            function = pickle.loads(function)
            self.functions[fn_id] = function
        return function

    def _mark(self, name: str) -> None:
        if name == self.last_name:
            return
        self.last_name = name
        _flush_std()
        marker = MARKER + f"{self.pid}:{name}\n".encode("utf-8", "replace")
        try:
            os.write(1, marker)
            os.write(2, marker)
        except OSError:
            pass

    def _set_env(self, resources: dict, gpu_ids: list | None) -> None:
        if not self.user_set_omp:
            threads = str(max(1, math.floor(resources.get("CPU", 1) or 1)))
            # no putenv per task; the environment's own dict read directly where there is
            # one (os.environ.get is four Python calls)
            now = (_ENVIRON_DATA.get(b"OMP_NUM_THREADS") if _ENVIRON_DATA is not None
                   else os.environ.get("OMP_NUM_THREADS"))
            if now != (threads.encode() if _ENVIRON_DATA is not None else threads):
                os.environ["OMP_NUM_THREADS"] = threads
        # What run_task compares to skip the next call: set only where a skip is exact.
        if gpu_ids or (not self.noset_cvd and self.cvd_on_zero) or (
                not self.user_set_omp and _ENVIRON_DATA is None):
            self.env_for = None
        else:
            self.env_for = dict(resources)
            self.omp_now = (None if self.user_set_omp
                            else _ENVIRON_DATA.get(b"OMP_NUM_THREADS"))
        if self.noset_cvd:
            return
        if gpu_ids:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        elif self.cvd_on_zero:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""

    def _restore_env(self, gpu_ids: list | None) -> None:
        if self.noset_cvd or not (gpu_ids or self.cvd_on_zero):
            return
        if self.base_cvd is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = self.base_cvd

    def warm_up(self) -> None:
        """Run a built-in no-op once through the path a task takes (its TASK message
        unpickled, the function unpickled, called, the result packed and pickled), so that
        the first task finds that code and its data already touched in this forked process
        (copy-on-write page faults, first calls) instead of paying for them. Nothing is sent
        and nothing is left behind: no output marker (the name is the last one's), no
        function kept, the environment, the task context and the last name as they were."""
        if not self.none_inline:  # its None would be stored as a value: not warmed then
            return
        fn_bytes = _WARM_UP[0] if _WARM_UP else prepare_warm_up()
        task_id = fn_id = b"\x00warm-up"
        message = pickle.loads(pickle.dumps(
            (protocol.TASK, task_id, fn_id, self.last_name, _NO_ARGS_BLOB, None,
             [task_id], 1, ({"CPU": 1.0}, None, True, False, "", None)), 5))
        omp = os.environ.get("OMP_NUM_THREADS")
        env_for, omp_now = self.env_for, self.omp_now
        self.functions[fn_id] = fn_bytes
        try:
            self.run_task(message, _discard)
        finally:
            self.functions.pop(fn_id, None)
            if omp is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            elif os.environ.get("OMP_NUM_THREADS") != omp:
                os.environ["OMP_NUM_THREADS"] = omp
            self.env_for, self.omp_now = env_for, omp_now

    def run_task(self, message: tuple, _send=None) -> None:
        """Run one TASK and send its RESULT (``_send``: where the RESULT goes instead; only
        ``warm_up`` passes one)."""
        (_, task_id, fn_id, name, args_blob, dep_values, return_ids, num_returns, ctx) = message
        resources, gpu_ids, gpu_ints, retry_exceptions, function_name, pg = ctx
        # The first tests of _await_control, _mark, prune, _function and _restore_env are
        # made here: each is a Python call per task that usually does nothing.
        if self.ctl_read != self.ctl_handled or self.ctl_poller.poll(0):
            self._await_control()
        if task_id in self.cancelled:
            from miniray.exceptions import TaskCancelledError

            self.cancelled.discard(task_id)
            error = serialization.dumps(TaskCancelledError(ids.TaskID(task_id)))
            self._send_result(task_id, [(protocol.ERR, error)] * max(1, num_returns), False)
            return
        if self.runtime.peer_out:  # left by a streaming call on another host's driver
            self.runtime.peer_out.clear()
        started = time_ns()  # the span a timeline shows: as this worker saw it
        loaded = returned = started
        if name != self.last_name:
            self._mark(name)
        if self.mappings.entries:
            self.mappings.prune()
        # _set_env is skipped when it would change nothing: the request is the one it last
        # applied (no GPU ids, none to hide) and OMP_NUM_THREADS is still what it set.
        if resources != self.env_for or gpu_ids or (
                self.omp_now is not None
                and _ENVIRON_DATA.get(b"OMP_NUM_THREADS") != self.omp_now):
            self._set_env(resources, gpu_ids)
        set_task = _current_task.set  # runtime.task's setter, without the property's call
        runtime = self.runtime
        runtime.main_task = task = TaskContext(task_id, name, function_name, resources,
                                               gpu_ids, gpu_ints, pg)
        set_task(task)
        outcome = None
        try:
            try:
                function = self.functions[fn_id]
                if isinstance(function, bytes):
                    function = self._function(fn_id)
                if dep_values or args_blob != _NO_ARGS_BLOB or self.serializers.stale:
                    args, kwargs = self._load_args(args_blob, dep_values)
                else:  # _load_args' first case, inlined: no arguments, nothing to apply
                    args, kwargs = (), {}
                with self.exec_lock:
                    self.current = task_id
                loaded = time_ns()
                try:
                    value = function(*args, **kwargs)
                    if num_returns < 0:  # a generator: run it while it can be cancelled
                        value = self._run_generator(task_id, name, value, num_returns)
                finally:
                    while True:
                        try:
                            returned = time_ns()
                            with self.exec_lock:
                                self.current = None
                                self.runtime.canceled.discard(task_id)
                                self.runtime.missed.discard(self.main_ident)
                                if self.injected:
                                    self.injected = False
                                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                                        ctypes.c_ulong(self.main_ident), None
                                    )
                            break
                        except KeyboardInterrupt:
                            # A cancel that raced the task's end, raised in here (its
                            # wake-up signal ends the wait for the lock): the block above
                            # clears it, so it comes once; the task is left all the same.
                            continue
                outcome = (True, value)
            except BaseException as error:  # reported to the owner, never lost
                outcome = (False, error)
        except KeyboardInterrupt as error:  # injected while leaving the task
            outcome = (False, error)
        set_task(None)  # runtime.task = None, without the property's call
        runtime.main_task = None
        if gpu_ids or self.cvd_on_zero:
            self._restore_env(gpu_ids)
        ok, value = outcome
        if not ok and isinstance(value, SystemExit):
            exit_for_system_exit(value, f"task {name}")
        if ok:
            if value is None and num_returns == 1 and self.none_inline:
                results = [(protocol.OK, _NONE_PAYLOAD, ())]  # _serialize_returns' first case
            else:
                results = self._serialize_returns(value, max(1, num_returns), name,
                                                  return_ids)
            retryable = False
        else:
            error = value
            task_error = task_error_for(
                error, name, pid=self.pid, ip=self.info.get("node_ip", "127.0.0.1"),
                traceback_str=_user_traceback(error), task_id=task_id,
            )
            retryable = not isinstance(error, KeyboardInterrupt) and is_retryable(
                task_error.cause, retry_exceptions)
            data = _dumps_error(task_error)
            results = [(protocol.ERR, data)] * max(1, num_returns)
        try:  # _flush_std(), inlined
            sys.stdout.flush()
        except Exception:
            pass
        try:
            sys.stderr.flush()
        except Exception:
            pass
        message = result_message(task_id, results, retryable, (started, loaded, returned))
        peer_out = self.runtime.peer_out
        if peer_out:  # a driver on another host: each large value's bytes follow RESULT
            sers = [peer_out[item[1][2]] for item in results
                    if type(item[1]) is tuple and item[1][0] == "peer"]
            peer_out.clear()
            self.channel.send_bulk(message, sers)
            return
        if _send is not None:
            _send(message)
            return
        self.channel.send(message)

    def _run_generator(self, task_id: bytes, name: str, generator, num_returns: int,
                       error_fields=None):
        """What a generator call returns once its generator is exhausted: None for a
        streaming call (each value was sent as it was yielded), the values' refs for a
        dynamic one."""
        if num_returns == STREAMING:
            streaming.stream(self, task_id, generator, name, error_fields)
            return None
        return streaming.dynamic(self, task_id, generator, name, error_fields)

    def _serialize_returns(self, value, num_returns: int, name: str, return_ids: list,
                           error_fields=None, may_keep: bool = True) -> list:
        """The RESULT items for a call's value, or its error for every return, whose header
        names ``name``. ``error_fields()`` gives the error's actor_id and actor_repr (called
        only on failure: an actor's repr is user code); ``may_keep``: as
        ``worker_api.result_route``'s."""
        from miniray.exceptions import RayError, RayTaskError

        def failed(error: BaseException, traceback_str: str | None = None,
                   done: list = ()) -> list:
            """``done`` (the returns already written) as they are, the rest failing."""
            fields = error_fields() if error_fields is not None else {}
            task_error = RayTaskError.from_exception(
                error, name, pid=self.pid, ip=self.info.get("node_ip", "127.0.0.1"),
                traceback_str=traceback_str, **fields)
            return list(done) + [(protocol.ERR, _dumps_error(task_error))] * max(
                1, num_returns - len(done))

        if value.__class__ is GeneratorReturns:  # a generator's, for N returns
            return self._generator_returns(value, num_returns, name, return_ids, failed,
                                           error_fields, may_keep)
        try:
            items = split_returns(value, num_returns)
        except Exception as error:  # wrong count or not a sequence: Ray's types
            return failed(error, f"{type(error).__name__}: {error}")
        results = []
        none_inline = self.none_inline
        for index, item in enumerate(items):
            if item is None and none_inline:
                results.append((protocol.OK, _NONE_PAYLOAD, ()))
                continue
            try:
                serialization.start_collecting()  # refs inside a return value: it holds them
                try:
                    payload = self.runtime.payload_for(return_ids[index], item, may_keep)
                finally:
                    inside = tuple(serialization.stop_collecting())
                results.append((protocol.OK, payload, inside))
            except Exception as failure:
                # As in Ray, the returns before this one are kept (handed over as usual);
                # this one and those after it fail.
                if isinstance(failure, RayError):  # ObjectStoreFullError: say it as it is
                    return failed(failure, done=results)
                which = "return value" if num_returns == 1 else f"return value {index}"
                error = TypeError(
                    f"Could not serialize the {which} of {name} (a {type(item).__name__}): "
                    f"{type(failure).__name__}: {failure}. Values a task returns must be "
                    "picklable; return the data needed to rebuild the object instead."
                )
                return failed(error, f"TypeError: {error}", done=results)
        return results

    def _generator_returns(self, taken: GeneratorReturns, num_returns: int, name: str,
                           return_ids: list, failed, error_fields, may_keep: bool) -> list:
        """The RESULT items of a generator's values for ``num_returns`` (Ray's rules,
        ``core/generator_returns.py``): the values it gave, then its error (or Ray's
        ValueError) for each return it did not give. What it did after the last return is
        only printed on stderr, as Ray logs it."""
        values = taken.values
        if taken.late_error is not None or taken.more:
            what = (f"raised after its {num_returns} returns were taken; the error is not "
                    f"returned:\n{_user_traceback(taken.late_error).rstrip()}"
                    if taken.late_error is not None else
                    f"yields more than num_returns={num_returns} values; the rest are not "
                    "returned.")
            print(f"{name}: the generator {what}", file=sys.stderr, flush=True)
        done = self._serialize_returns(values[0] if len(values) == 1 else values,
                                       len(values), name, return_ids, error_fields,
                                       may_keep) if values else []
        error = taken.missing_error(num_returns)
        if error is None:
            return done
        text = (_user_traceback(error) if error is taken.error
                else f"{type(error).__name__}: {error}")
        return failed(error, text, done=done)

    def _send_result(self, task_id: bytes, results: list, retryable: bool,
                     times: tuple | None = None) -> None:
        self.channel.send(result_message(task_id, results, retryable, times))


# The warm-up's function, pickled by value as a function of the driver's script is (its
# module is no module of this process): made once in the fork server before it forks
# (``prepare_warm_up``), so no worker pays for pickling it.
_WARM_UP: list = []


def prepare_warm_up() -> bytes:
    """The pickled no-op ``_Worker.warm_up`` runs; made once per process."""
    if not _WARM_UP:
        namespace: dict = {"__name__": "miniray-warm-up"}
        exec("def warm_up():\n    return None\n", namespace)  # noqa: S102 (constant text)
        _WARM_UP.append(serialization.dumps_function(namespace["warm_up"], "warm-up"))
    return _WARM_UP[0]


def _discard(message: tuple) -> None:
    """The warm-up's RESULT: pickled as a real one is, then dropped."""
    pickle.dumps(message, protocol=5)


def _wait_for_file(path: str, timeout: float) -> None:
    """Tests only (``config.test_actor_cancel_gate``): until ``path`` exists, at most
    ``timeout`` seconds."""
    from time import sleep

    deadline = monotonic() + timeout
    while not os.path.exists(path) and monotonic() < deadline:
        sleep(0.01)


def _apply_hello(info: dict) -> tuple[dict, str]:
    """The driver's paths and directory, then this worker's runtime environment: the job's,
    or the one HELLO names (``runtime_env_key``, a task's or actor's own). Returns the
    environment and its key."""
    if info.get("job_id"):  # the driver's job: the ids this worker makes carry it
        ids.set_job_id(info["job_id"])
    for path in reversed(info.get("sys_path", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    cwd = info.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError:
            pass
    key = info.get("runtime_env_key") or ""
    env = runtime_envs.from_key(key) if key else (info.get("runtime_env") or {})
    runtime_env_setup.apply(env, info.get("session_dir", ""))
    logging_dict = info.get("logging_config")
    if logging_dict:  # the job's LoggingConfig, before the setup hook and any task logs
        logging_config.configure_process(logging_config.LoggingConfig.from_dict(logging_dict))
    if info.get("ray_alias"):
        alias.install()
    return env, key


def announce_ready(channel: Channel) -> None:
    """Tell the owner this worker is set up (init() returns once a prestarted worker is this
    far). An owner that left meanwhile (a shutdown while workers start) ends the worker
    quietly: nothing it could say would be read."""
    try:
        channel.send((protocol.READY, os.getpid()))
    except OSError:
        _flush_std()
        os._exit(0)


def _remote_transport(data_fd: int, ctl_fd: int, remote: dict):
    """A remote driver's worker: its data and control connections as MAC'd channels
    (``peer_channel.FramedPeer``), rebuilt from the frame state its node handed over."""
    from miniray._private.transport import peer_channel  # lazy: remote workers only

    data_state, ctl_state = remote["frames"]
    conn = peer_channel.FramedPeer(peer_channel.PeerChannel.from_state(
        socket.socket(fileno=data_fd), data_state))
    ctl = peer_channel.FramedPeer(peer_channel.PeerChannel.from_state(
        socket.socket(fileno=ctl_fd), ctl_state))
    return conn, ctl


def _remote_info(info: dict, remote: dict) -> dict:
    """HELLO comes from a driver on another host: this host's session, node and shared
    memory replace the driver's, and large results travel as frames after RESULT
    (``store["remote"]``: ``WorkerRuntime.payload_for``)."""
    node = remote.get("node") or {}
    info = dict(info)
    for name in ("session_dir", "node_id", "node_ip"):
        if node.get(name):
            info[name] = node[name]
    store = dict(info.get("store") or {})
    store["remote"] = True
    if node.get("shm_dir"):
        store["shm_dir"] = node["shm_dir"]
    info["store"] = store
    return info


def run_forked(data_fd: int, ctl_fd: int, out_fd: int, err_fd: int,
               remote: dict | None = None) -> None:
    """The worker's entry point, in a child just forked by the fork server. ``remote``: a
    remote driver's worker (its node's ``(SPAWN, req, remote)``): data and control speak
    MAC'd frames; stdout and stderr stay plain byte streams (ARCHITECTURE.md says why)."""
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass
    if remote is None:
        conn = FramedSocket(socket.socket(fileno=data_fd))
        ctl = Connection(ctl_fd)
    else:
        conn, ctl = _remote_transport(data_fd, ctl_fd, remote)
    channel = Channel(conn)
    channel.remote = remote is not None
    try:
        hello = channel.next_message()
    except (EOFError, OSError):
        os._exit(0)
    if hello[0] != protocol.HELLO:
        os._exit(2)
    info = hello[1] if remote is None else _remote_info(hello[1], remote)
    try:
        env, key = _apply_hello(info)
    except Exception:  # a directory gone since submission, say: the worker cannot start
        sys.stderr.write("The worker's runtime_env could not be applied:\n"
                         + traceback.format_exc())
        _flush_std()
        os._exit(1)
    execute.metrics_session_dir = info.get("session_dir", "")
    worker = _Worker(channel, ctl, info)
    worker.runtime.runtime_env, worker.runtime.runtime_env_key = env, key
    context.set_current(worker.runtime)
    hook = info.get("setup_hook")
    if hook is not None:  # once per worker process, before its first task, as in Ray
        error = runtime_env_setup.run_setup_hook(hook)
        if error is not None:  # the worker exits: its task is retried or fails, as in Ray
            sys.stderr.write(error)
            _flush_std()
            os._exit(1)
    worker.start_control_thread()
    announce_ready(channel)
    # After READY: init() does not wait for it, and the first task does not pay for it; not
    # when a task came already (a worker started for it): it would only wait longer.
    if channel.nothing_waiting():
        try:
            worker.warm_up()
        except Exception:  # one that fails changes nothing: the task path is intact
            pass
    try:
        worker.loop()
    finally:
        _flush_std()
        os._exit(0)
