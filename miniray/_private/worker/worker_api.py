"""What the public API does inside a worker process.

Owns: the worker's side of the data socket (one reader at a time, replies matched to requests by
id), and the worker-mode implementations of submit, put, get, wait and the runtime-context
queries. Does not own: running tasks (``worker_main.py``) or anything the owner decides.
Called by: the public API (through ``runtime.current()``) when running inside a worker.

Reading follows the leader/follower pattern: whichever thread needs a reply takes the read lock
and reads frames, handing replies to the threads waiting for them and queueing task messages for
the main loop; the others wait on a condition until their reply arrives or the lock is free.

Pipelining: the owner may send tasks ahead of the running one. A GET, WAIT or stream ``next()``
may wait on one of them, so before sending it the worker gives back (``GIVE_BACK``) every task
waiting in its inbox, and gives back each task that arrives until the reply of every such
request has been read (``core/pipelining.py``). A GIVE_BACK (this one or a RECALL's) is
written before the RESULT of any task received after those it names: the owner expects each
RESULT of the task first in its in-flight list (``_give_back_inbox``, ``_take_frames``).

A worker for a driver on another host: a large argument's bytes follow its TASK as frames
(read into one buffer, ``Channel._receive_bulk``) and a large result's follow RESULT
(``payload_for`` names it ``("peer", size, index)``, ``Channel.send_bulk`` sends it), in
frames of at most ``framing.PEER_CHUNK``, unless its driver asked for results kept on this
host (``result_route``: then it is a segment of this host's store, ``("kept", path,
size)``); its
nested tasks, ``get``, ``wait``, ``put`` and actor calls are the same messages as a local
worker's, served by the driver (``owner/remote_requests.py``): a large ``put``'s bytes
follow PUT (``send_bulk``), a large value of a GET's REPLY follows it
(``Channel._with_bulk``); an ObjectRef inside an argument is read by ``get`` like any.

Cancelling: a GET or WAIT names the call that waits; once that call is cancelled the owner
answers CANCELLED and the wait raises KeyboardInterrupt, as Ray's ``get`` does in a cancelled
task. No exception is injected into a thread while it talks to the owner (``_shielded``).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import mmap
import os
import pickle
import select
import sys
import threading
from typing import Any

from miniray._private.core import config, ids, oob, pipelining, protocol, serialization
from miniray._private.object_store import kept_budget, shm_segments, values
from miniray._private.transport.framing import FramedSocket, send_in_frames
from miniray.exceptions import ObjectStoreFullError

SPARE_MIN = 1 << 20  # a large value this big or more is received into an anonymous mapping
SPARE_MAX = 256 << 20  # the most a remote worker keeps as its spare receive buffer
KEEP_RESERVE_WAIT_S = 0.05  # the most a result waits for its link's budget file; then it is sent


class Channel:
    """The worker's end of its data socket."""

    def __init__(self, conn: FramedSocket):
        self.conn = conn
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._cond_lock = threading.Lock()  # held as itself where no wait or notify follows
        self._cond = threading.Condition(self._cond_lock)
        self._replies: dict[int, Any] = {}
        self._incoming: collections.deque = collections.deque()
        self._req_ids = itertools.count(1)
        # Requests that may wait on another task (GET, WAIT, stream next) and whose reply
        # has not been read: while there is one, an arriving TASK goes back to the owner.
        self._blocking: set[int] = set()
        self.before_send = None  # returns a message to send first (the borrow report), or None
        # Empty when ``before_send`` has nothing to send (the runtime's ref events): ``send``
        # and ``flush`` skip the call then. None: always call it.
        self.before_send_pending = None
        # A worker for a driver on another host: a TASK's large arguments follow it as
        # frames (``_receive_bulk``); a local worker never looks for them.
        self.remote = False
        self._spare = None  # the last large value's receive buffer (``_receive_bulk``)

    def nothing_waiting(self) -> bool:
        """Whether no message has arrived that the main loop has not taken: none in the
        inbox, none begun in the socket's buffer, none in the socket. A remote driver's
        channel keeps frames where this does not look: False there."""
        if self.remote or self._incoming or getattr(self.conn, "buffer", None):
            return False
        poller = select.poll()
        poller.register(self.conn.fileno(), select.POLLIN)
        try:
            return not poller.poll(0)
        except OSError:
            return False

    def send(self, message: tuple) -> None:
        data = pickle.dumps(message, protocol=5)
        with self._send_lock:
            pending = self.before_send_pending  # _report_first()'s test, inlined
            if self.before_send is not None and (pending is None or pending):
                self._report_first()
            self.conn.send(data)

    def send_bulk(self, message: tuple, sers: list) -> None:
        """Send ``message`` (a RESULT, or a PUT), then the bytes of each large value it
        names as ``("peer", size, ...)``, in one hold of the send lock: nothing else comes
        between them. A value's bytes are its segment's (``oob.load_segment``'s layout): each
        piece of the serialized value (header, metadata, padding, each array's buffer) in
        order, uncopied (``framing.send_in_frames``); the driver receives them straight into
        a new segment of its store. A worker for a driver on another host only."""
        data = pickle.dumps(message, protocol=5)
        with self._send_lock:
            self._report_first()
            self.conn.send(data)
            for ser in sers:
                for piece in ser.pieces():
                    send_in_frames(self.conn.send, piece)

    def flush(self) -> None:
        """Send the pending borrow report, if any, on its own."""
        pending = self.before_send_pending
        if pending is not None and not pending:
            return  # nothing to report: an event added just after this look goes with
            # the next send, as one added just after the report under the lock would
        with self._send_lock:
            self._report_first()

    def _report_first(self) -> None:
        """*Send lock held.* The borrow report (refs this worker took before what it now
        says), when ``before_send`` may have one, goes before the next message."""
        pending = self.before_send_pending
        if self.before_send is not None and (pending is None or pending):
            first = self.before_send()
            if first is not None:
                self.conn.send(pickle.dumps(first, protocol=5))

    def new_request_id(self) -> int:
        return next(self._req_ids)

    def request(self, message: tuple, req_id: int, blocking: bool = False) -> Any:
        """Send ``message`` and wait for its reply. ``blocking``: it may wait on another
        task, so the tasks received but not started go back to the owner first."""
        if not blocking:
            self.send(message)
            return self.wait_reply(req_id)
        try:
            # The request first: the owner knows the worker is blocked when the tasks come.
            self._give_back_inbox([message], req_id)
            return self.wait_reply(req_id)
        finally:
            with self._cond:
                self._blocking.discard(req_id)

    def give_back_waiting(self) -> None:
        """The owner asked (RECALL): give back the tasks received but not started. Those
        still in the socket are read first, unless another thread is reading (it then
        waits for a reply, and hands back what arrives meanwhile)."""
        if self._read_lock.acquire(blocking=False):
            try:
                frames, _closed = self.conn.recv_ready()
                self._take_frames(frames)
            finally:
                self._read_lock.release()
                with self._cond:
                    self._cond.notify_all()
        # Always answered, even with none left: the owner then asks again when it may.
        self._give_back_inbox([], None)

    def _give_back_inbox(self, before: list, blocking_id: int | None) -> None:
        """Write ``before``, then a GIVE_BACK of the tasks waiting in the inbox (none: only
        ``before`` when it is a request, an empty GIVE_BACK when it is not). ``blocking_id``:
        from now on a task that arrives goes back too.

        The inbox is split and the GIVE_BACK written in one hold of the send lock: a task
        that arrives after the split and runs at once has its RESULT written after the
        GIVE_BACK. The owner expects each RESULT of the task first in its in-flight list;
        a RESULT ahead of the GIVE_BACK of an earlier task found another one there, was
        dropped, and left its task in flight for ever (the worker idle, the owner waiting)."""
        frames = [pickle.dumps(message, protocol=5) for message in before]
        with self._send_lock:
            with self._cond:
                if blocking_id is not None:
                    self._blocking.add(blocking_id)
                kept, task_ids = pipelining.split_hand_back(self._incoming, protocol.TASK)
                if task_ids:
                    self._incoming.clear()
                    self._incoming.extend(kept)
            if task_ids or blocking_id is None:
                frames.append(pickle.dumps((protocol.GIVE_BACK, task_ids), protocol=5))
            if self.before_send is not None:
                first = self.before_send()
                if first is not None:  # refs this worker took before what it now says
                    frames.insert(0, pickle.dumps(first, protocol=5))
            if len(frames) == 1:
                self.conn.send(frames[0])
            else:
                self.conn.send_frames(frames)

    def send_many(self, messages: list) -> None:
        """Send several messages in one write."""
        frames = [pickle.dumps(message, protocol=5) for message in messages]
        with self._send_lock:
            if self.before_send is not None:
                first = self.before_send()
                if first is not None:
                    frames.insert(0, pickle.dumps(first, protocol=5))
            self.conn.send_frames(frames)

    def _read_one(self) -> None:
        try:
            frames = self.conn.recv()
        except (EOFError, OSError):
            # The owner is gone: nothing this worker does can matter any more.
            _exit_now()
        self._take_frames(frames)

    def _take_frames(self, frames: list) -> None:
        """*Read lock held.* Replies to their waiters, other messages to the inbox (a task
        that arrives while a request may block goes back to the owner). Tasks given back
        are written before a later message enters the inbox: once it is there the main
        loop may run it and write its RESULT, which must not come before that GIVE_BACK
        (``_give_back_inbox``). A reply read meanwhile may wake its waiter: its task was
        received before those given back, so its RESULT may come first."""
        given_back = None
        frames = iter(frames)
        for data in frames:
            message = pickle.loads(data)
            if self.remote:  # a large value's bytes may follow a TASK or a GET's REPLY
                message = self._with_bulk(message, frames)
            if message[0] == protocol.REPLY:
                with self._cond:
                    self._replies[message[1]] = message[2]
                    self._blocking.discard(message[1])
                    self._cond.notify_all()
            else:
                with self._cond_lock:  # the condition's own lock: no wait or notify here
                    keep = message[0] != protocol.TASK or not self._blocking
                    if keep and not given_back:
                        self._incoming.append(message)
                        continue
                if keep:  # the tasks given back so far are written before it enters
                    self.send((protocol.GIVE_BACK, given_back))
                    given_back = None
                    with self._cond:  # looked at again: a request may block by now
                        if message[0] != protocol.TASK or not self._blocking:
                            self._incoming.append(message)
                            continue
                # Sent before the owner knew this worker blocks: it may be what it waits for.
                if given_back is None:
                    given_back = []
                given_back.append(message[1])
        if given_back:
            self.send((protocol.GIVE_BACK, given_back))

    def _with_bulk(self, message: tuple, frames) -> tuple:
        """*Read lock held.* ``message`` from a driver on another host with the bytes of
        each large value it names as ``("peer", size)`` read in (``_receive_bulk``): a
        TASK's arguments become ``("peer", buffer)``, a GET REPLY's values ``("peer",
        buffer, size)`` (``values.read`` loads those). Any other message as it is."""
        tag = message[0]
        if tag == protocol.TASK and message[5] and any(
                type(d[2]) is tuple and d[2][0] == "peer" for d in message[5]):
            deps = [(position, kind, ("peer", self._receive_bulk(data[1], frames))
                     if type(data) is tuple and data[0] == "peer" else data)
                    for position, kind, data in message[5]]
            return message[:5] + (deps,) + message[6:]
        if tag == protocol.REPLY and type(message[2]) is list and any(
                type(item) is tuple and type(item[1]) is tuple and item[1][0] == "peer"
                for item in message[2]):
            items = [(kind, ("peer", self._receive_bulk(data[1], frames), data[1])
                      if type(data) is tuple and data[0] == "peer" else data)
                     for kind, data in message[2]]
            return (tag, message[1], items)
        return message

    def _receive_bulk(self, size: int, frames) -> memoryview:
        """*Read lock held.* One large value's ``size`` bytes, which follow its message as
        frames (``framing.send_in_frames``), read into a buffer of its own: from the frames
        already read (``frames``, an iterator, advanced) and then straight from the
        connection as one value (``recv_value_into``: no other copy; each frame's tag
        checked on the MAC pool while the next arrives, all of them before it returns).
        The buffer is an anonymous mapping (its pages are faulted in as the bytes arrive,
        never zeroed first as a bytearray's are), and the last one (``SPARE_MIN`` to
        ``SPARE_MAX`` bytes) is kept: the next value of about its size goes into it again
        when nothing refers to it any more (the task that read it ended and kept no view of
        it), skipping the page faults of a fresh buffer (about 0.5 ms per MB here)."""
        buffer = self._spare
        if buffer is not None and not (size <= len(buffer) <= size + size // 4
                                       and sys.getrefcount(buffer) == 3):
            buffer = self._spare = None  # too small or large, or a value still uses it
        if buffer is None:
            buffer = mmap.mmap(-1, size) if size >= SPARE_MIN else bytearray(size)
            if SPARE_MIN <= size <= SPARE_MAX:
                self._spare = buffer
        view = memoryview(buffer)[:size]
        offset = 0
        while offset < size:
            frame = next(frames, None)
            if frame is not None:
                n = len(frame)
                if n > size - offset:  # a wrong length: the stream cannot go on
                    _driver_link_broken(
                        f"a frame of {n} bytes does not fit the {size - offset} bytes left "
                        f"of a value of {size} bytes (the driver sent a wrong length)")
                view[offset:offset + n] = frame
                offset += n
                continue
            channel = self.conn.channel
            try:
                if hasattr(channel, "recv_value_into"):  # the rest as one value: each
                    channel.recv_value_into(view[offset:])  # tag checked on return
                    break
                offset += channel.recv_bytes_into(view[offset:])
            except EOFError:
                _exit_now()  # the driver is gone
            except OSError as error:  # EOF (PeerClosed), or a frame failed its check
                _driver_link_broken(error)
        return view

    def wait_reply(self, req_id: int) -> Any:
        while True:
            with self._cond:
                if req_id in self._replies:
                    return self._replies.pop(req_id)
            if self._read_lock.acquire(blocking=False):
                try:
                    while req_id not in self._replies:
                        self._read_one()
                finally:
                    self._read_lock.release()
                    with self._cond:
                        self._cond.notify_all()
            else:
                with self._cond:
                    if req_id not in self._replies:
                        self._cond.wait(0.05)

    def next_message(self) -> tuple:
        """The next non-reply message, for the main loop."""
        while True:
            # Looked at and taken under one hold of the condition's lock: a RECALL on the
            # control thread may empty the inbox between a look and a take made apart.
            with self._cond_lock:  # the condition's own lock (no wait or notify here)
                if self._incoming:
                    return self._incoming.popleft()
            with self._read_lock:
                if not self._incoming:
                    self._read_one()


def result_route(size: int, store: dict, may_keep: bool = True) -> str:
    """How a task's serialized result of ``size`` bytes goes to its owner (pure):

    * ``"inline"``: below the store's inline threshold, in RESULT itself;
    * ``"shm"``: a local worker's: a segment of the owner's store, adopted by the owner;
    * ``"keep"``: a remote driver's worker whose driver asked for kept results (HELLO's
      ``store["keep_tag"]``, the node's tag of the driver's link) and whose value fits the
      node's cap for that link (``store["keep_max"]``): a segment of this host's store
      named with that tag, answered ``("kept", path, size)``; the node keeps it for the
      link (``node/kept_objects.py``). Sent instead when the link's bytes there would pass
      the cap (``payload_for``: ``kept_budget.reserve`` first) or the shm dir is full; not
      with ``may_keep`` False (a streaming call's value: its driver takes each as it comes);
    * ``"send"``: any other remote driver's worker: the bytes follow RESULT.

    >>> result_route(10, {"inline_threshold": 100})
    'inline'
    >>> result_route(500, {"inline_threshold": 100}), result_route(500, {
    ...     "inline_threshold": 100, "remote": True})
    ('shm', 'send')
    >>> result_route(500, {"inline_threshold": 100, "remote": True, "keep_tag": "t" * 16,
    ...                    "keep_max": 1000})
    'keep'
    >>> result_route(500, {"inline_threshold": 100, "remote": True, "keep_tag": "t" * 16,
    ...                    "keep_max": 1000}, may_keep=False)
    'send'
    """
    if size < store["inline_threshold"]:
        return "inline"
    if not store.get("remote"):
        return "shm"
    if may_keep and store.get("keep_tag") and size <= int(store.get("keep_max") or 0):
        return "keep"
    return "send"


def _test_die_after_reserve() -> None:
    """Tests only (``config.test_die_after_keep_reserve``): the first worker to reserve
    room for a kept result after the marker file was made removes it and dies by SIGKILL
    before it writes, as a worker killed between its reservation and the node's book."""
    marker = config.test_die_after_keep_reserve()
    if marker is None:
        return
    try:
        os.unlink(marker)  # one worker only: whoever removes it
    except OSError:
        return
    import signal  # lazy: tests only

    os.kill(os.getpid(), signal.SIGKILL)


def _driver_link_broken(why) -> None:
    """The connection to a driver on another host cannot go on (``why``: the error or a
    text): said on stderr (which its node relays to the driver), unless the driver just
    closed it, and this worker exits, as on EOF; never an exception in the thread that
    reads (nothing could close the link from there)."""
    from miniray._private.transport.peer_wire import PeerClosed  # lazy: the error path only

    if not isinstance(why, (EOFError, PeerClosed)):
        try:
            sys.stderr.write(f"miniray worker pid {os.getpid()}: closing the connection to "
                             f"its driver: {why}\n")
        except Exception:
            pass
    _exit_now()


def _exit_now() -> None:
    try:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(0)


class TaskContext:
    """What the currently running task may ask about itself."""

    __slots__ = ("task_id", "name", "function_name", "resources", "gpu_ids", "gpu_ids_are_ints",
                 "placement")

    def __init__(self, task_id, name, function_name, resources, gpu_ids, gpu_ids_are_ints,
                 placement=None):
        self.task_id = task_id
        self.placement = placement  # (hex, bundles, capture) of its placement group, or None
        self.name = name
        self.function_name = function_name
        self.resources = resources
        self.gpu_ids = gpu_ids
        self.gpu_ids_are_ints = gpu_ids_are_ints


_current_task: contextvars.ContextVar = contextvars.ContextVar("miniray_task", default=None)


class WorkerRuntime:
    """The runtime the public API talks to inside a worker."""

    mode = "worker"

    def __init__(self, channel: Channel, info: dict):
        self.channel = channel
        self.info = info
        self.peer_out: list = []  # large values of the running task, for another host
        # Held from a value's serialization to its send when calls run at once (a threaded
        # or async actor's, each streaming call's values): ``peer_out`` is theirs in turn.
        self.peer_lock = threading.Lock()
        # Cancelling: the worker's control thread and the threads talking to the owner share
        # this lock. ``waiting`` holds the idents of threads inside an exchange with the
        # owner (``_shielded``: no exception is injected there); ``missed`` those a cancel
        # reached meanwhile (it is raised when the exchange ends);
        # ``canceled`` the tasks (not actor calls) cancelled while they run here.
        self.cancel_lock = threading.Lock()
        self.waiting: set[int] = set()
        self.missed: set[int] = set()
        self.canceled: set[bytes] = set()
        self.session_token = object()
        self.worker_id = os.urandom(28).hex()
        self.actor = None  # an ActorContext once this worker hosts an actor
        # The task the main thread runs (a task worker's; None in an actor's): what the
        # runtime context reports in a thread that task started, as Ray does.
        self.main_task: TaskContext | None = None
        # The job's runtime environment, and this worker's own (set once it is applied):
        # tasks submitted from here run in it unless they name one (merged over it).
        self.job_runtime_env = info.get("runtime_env") or {}
        self.runtime_env: dict = self.job_runtime_env
        self.runtime_env_key = ""
        self._ref_events: collections.deque = collections.deque()
        self._held: dict[bytes, int] = {}
        self._handles_held: dict[bytes, int] = {}  # actor id -> this worker's live handles
        channel.before_send = self.borrow_report
        channel.before_send_pending = self._ref_events
        self.actor_resources: dict = {}
        self.actor_gpu_ids: tuple = (None, True)
        # Functions and classes this worker has sent to the owner; kept for the worker's life
        # (an actor's constructor may create actors before any call has run).
        self._sent_functions: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def task(self) -> TaskContext | None:
        """The running task or actor call of this thread (or asyncio task)."""
        return _current_task.get()

    @task.setter
    def task(self, value: TaskContext | None) -> None:
        _current_task.set(value)

    # -- ObjectRef tracking: this worker reports the refs it holds ---------------------
    # Events are appended lock-free (``__del__`` may run anywhere) and turned into a BORROW
    # report under the channel's send lock, before the next message: a ref the worker took
    # while running a task is registered before that task's result releases the holds.
    def ref_created(self, object_id: bytes) -> None:
        self._ref_events.append((object_id, 1))

    def ref_dropped(self, object_id: bytes) -> None:
        self._ref_events.append((object_id, -1))

    def ref_pickled(self, object_id: bytes) -> None:
        self._ref_events.append((object_id, 0))

    def borrow_report(self):
        """(BORROW, added, dropped, escaped, handles) since the last report, or None. Called
        with the channel's send lock held. ``handles``: this worker's actor handle events in
        order, as ``(actor_id, delta)``: +1 when it starts holding a handle to that actor,
        -1 when it holds none any more, 0 when one was pickled (it may live elsewhere).
        Unlike refs, a handle taken and dropped since the last report is reported both
        ways: the owner's count of it must go down to end the actor (Ray ends an actor when
        its last handle is gone, wherever it was made)."""
        events = self._ref_events
        if not events:
            return None
        held = self._held
        added, dropped, escaped = set(), set(), []
        handles = []
        while events:
            try:
                object_id, delta = events.popleft()
            except IndexError:
                break
            if object_id.__class__ is tuple:  # an actor handle's event (actor_handle_event)
                self._handle_event(object_id[1], delta, handles)
                continue
            if delta == 0:
                escaped.append(object_id)
                continue
            old = held.get(object_id, 0)
            new = old + delta
            if new <= 0:
                held.pop(object_id, None)
                if old > 0:
                    if object_id in added:
                        added.discard(object_id)
                    else:
                        dropped.add(object_id)
            else:
                held[object_id] = new
                if old <= 0:
                    if object_id in dropped:
                        dropped.discard(object_id)
                    else:
                        added.add(object_id)
        if not (added or dropped or escaped or handles):
            return None
        return (protocol.BORROW, list(added), list(dropped), escaped, handles)

    def _handle_event(self, actor_id: bytes, delta: int, out: list) -> None:
        """*Send lock held.* One handle event into ``out`` (``borrow_report``'s
        ``handles``) when it changes what this worker holds, or is a pickling."""
        if delta == 0:
            out.append((actor_id, 0))
            return
        held = self._handles_held
        old = held.get(actor_id, 0)
        new = old + delta
        if new > 0:
            held[actor_id] = new
        else:
            held.pop(actor_id, None)
        if old <= 0 < new:
            out.append((actor_id, 1))
        elif new <= 0 < old:
            out.append((actor_id, -1))

    def as_future(self, ref):
        return values.future_of(self, ref)

    # -- the API -------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return True

    def needs_function(self, fn_id: bytes) -> bool:
        with self._lock:
            if fn_id in self._sent_functions:
                return False
            self._sent_functions.add(fn_id)
            return True

    def submit_task(self, spec) -> None:
        task = self.task  # the submitting call: a recursive cancel of it reaches this task
        with self._shielded():
            self.channel.send((protocol.SUBMIT, spec, task.task_id if task else None))

    def put_value(self, object_id: bytes, value, contained=()) -> None:
        """Small values travel inline; large ones go straight into a shared-memory segment,
        which the owner adopts (this worker never unlinks it)."""
        serialization.start_collecting()
        try:
            ser = value if isinstance(value, oob.Serialized) else oob.serialize(value)
            store = self.info["store"]
            if store.get("remote") and ser.total_size >= store["inline_threshold"]:
                payload = None  # a driver on another host: the bytes follow PUT
            else:
                payload = self.payload_for(object_id, ser)
        finally:
            contained = tuple(contained) + tuple(serialization.stop_collecting())
        with self._shielded():
            if payload is None:
                self.channel.send_bulk((protocol.PUT, object_id, protocol.OK,
                                        ("peer", ser.total_size), contained), [ser])
            else:
                self.channel.send((protocol.PUT, object_id, protocol.OK, payload, contained))

    @property
    def large_arguments(self) -> tuple:
        """``(threshold, put)`` for ``serialization.pack_arguments`` (see the driver's)."""
        return self.info["store"]["inline_threshold"], self._put_argument

    def _put_argument(self, ser: oob.Serialized, contained: tuple) -> bytes:
        object_id = ids.new_put_id()
        self.put_value(object_id, ser, contained)
        return object_id

    def payload_for(self, object_id: bytes, value, may_keep: bool = True):
        """``value`` may be serialized already (``oob.Serialized``: a large argument); the
        route is ``result_route``'s."""
        store = self.info["store"]
        ser = value if isinstance(value, oob.Serialized) else oob.serialize(value)
        route = result_route(ser.total_size, store, may_keep)
        if route == "inline":
            return oob.inline_blob(ser)
        if route == "keep":  # stays in this host's store for the driver's link
            shm_dir, tag, size = store["shm_dir"], store["keep_tag"], ser.total_size
            # Counted against the node's cap for this driver before it is written: past
            # it (or the link gone, or the budget file's lock held longer than
            # KEEP_RESERVE_WAIT_S by another worker stopped inside it), the value is sent.
            route = "send"
            if kept_budget.reserve(shm_dir, tag, size, int(store["keep_max"]), object_id,
                                   wait_s=KEEP_RESERVE_WAIT_S):
                _test_die_after_reserve()
                try:
                    path, size = shm_segments.create_segment(
                        tag, object_id, ser, shm_dir=shm_dir,
                        inline_threshold=store["inline_threshold"])
                    return ("kept", path, size)
                except ObjectStoreFullError:  # no room in this host's store: send it
                    kept_budget.unreserve(shm_dir, tag, object_id, os.getpid())
                except BaseException:  # any other failure: the reservation goes back too
                    kept_budget.unreserve(shm_dir, tag, object_id, os.getpid())
                    raise
        if route == "send":  # a worker for a driver on another host: bytes follow
            self.peer_out.append(ser)  # RESULT (worker_main sends them, send_bulk)
            return ("peer", ser.total_size, len(self.peer_out) - 1)
        path, size = shm_segments.create_segment(
            store["session_tag"], object_id, ser, shm_dir=store["shm_dir"],
            inline_threshold=store["inline_threshold"])
        return ("shm", path, size)

    def get_serialized(self, object_ids: list[bytes], timeout: float | None):
        """[(kind, data)] in order, or None on timeout."""
        req = self.channel.new_request_id()
        reply = self._wait_request(
            (protocol.GET, req, object_ids, timeout, self._interruptible()), req)
        if reply == protocol.TIMEOUT:
            return None
        return reply

    def wait_ready(self, object_ids: list[bytes], num_returns: int, timeout: float | None):
        """The set of ready ids (at least num_returns unless the timeout passed)."""
        req = self.channel.new_request_id()
        return self._wait_request(
            (protocol.WAIT, req, object_ids, num_returns, timeout, self._interruptible()), req)

    def _interruptible(self) -> bytes | None:
        """The call whose cancel ends this wait: the running task or sync actor call. None
        outside a call, and in an async actor (Ray cancels its coroutine instead)."""
        task = self.task
        host = self.host
        if task is None or (host is not None and host.loop is not None):
            return None
        return task.task_id

    def _wait_request(self, message: tuple, req_id: int):
        """Send a GET or WAIT and wait for its reply; KeyboardInterrupt if the waiting call
        was cancelled, as Ray raises it in a cancelled call's ``get()``."""
        with self._shielded():
            reply = self.channel.request(message, req_id, blocking=True)
        if type(reply) is int and reply == protocol.CANCELLED:
            # The owner's answer may come before its CANCEL on the control socket is read:
            # the call is cancelled from now on (is_canceled(), its result), and that CANCEL
            # will not interrupt it a second time.
            task_id = message[-1]
            host = self.host
            with self.cancel_lock:
                if host is None:
                    self.canceled.add(task_id)
            if host is not None:
                host.flag_cancelled(task_id)
            raise KeyboardInterrupt
        return reply

    @contextlib.contextmanager
    def _shielded(self):
        """Talk to the owner with no exception injected meanwhile (one landing mid-frame would
        lose or tear a message): a cancel that comes now is raised once the exchange is
        done, as a KeyboardInterrupt (the owner also answers a pending wait CANCELLED)."""
        ident = threading.get_ident()
        outer = False  # nested ones leave it to the outermost
        missed = False
        try:
            with self.cancel_lock:
                if ident not in self.waiting:
                    outer = True  # first: an exception landing in between leaves nothing
                    self.waiting.add(ident)
            yield
        finally:
            if outer:
                with self.cancel_lock:
                    self.waiting.discard(ident)
                    missed = ident in self.missed
                    self.missed.discard(ident)
        if missed:
            raise KeyboardInterrupt

    def call(self, method: int, *args, blocking: bool = False):
        req = self.channel.new_request_id()
        with self._shielded():
            ok, value = self.channel.request((protocol.CALL, req, method, args), req,
                                             blocking=blocking)
        if not ok:
            raise value
        return value

    def stream_next(self, task_id: bytes, index: int, timeout):
        """As the driver's: asked of the owner, which answers once it can (the worker is
        blocked meanwhile, as in a ``get()``)."""
        return self.call(protocol.CALL_STREAM_NEXT, task_id, index, timeout, blocking=True)

    def cancel(self, object_id: bytes, force: bool, recursive: bool) -> None:
        self.call(protocol.CALL_CANCEL, object_id, force, recursive)

    def cluster_resources(self) -> dict:
        return self.call(protocol.CALL_CLUSTER_RESOURCES)

    def available_resources(self) -> dict:
        return self.call(protocol.CALL_AVAILABLE_RESOURCES)

    def nodes(self) -> list:
        return self.call(protocol.CALL_NODES)

    # -- placement groups: asked of the driver's owner (owner/placement_groups.py) ----------
    actor_placement = None  # an actor's placement group context, for its whole life

    def current_placement(self):
        """``(hex, bundles, capture)`` of the group the running task or actor is in."""
        task = self.task
        if task is not None and task.placement is not None:
            return task.placement
        return self.actor_placement

    def _pg(self, op: str, *args):
        return self.call(protocol.CALL_PLACEMENT_GROUP, op, *args)

    def placement_group_create(self, hex_, bundles, strategy, name, detached) -> None:
        self._pg("create", hex_, bundles, strategy, name, detached)

    def placement_group_ready(self, handle):
        from miniray._private.core.object_ref import ObjectRef  # lazy: placement only

        return ObjectRef(self._pg("ready", handle))

    def placement_group_wait(self, hex_: str, timeout: float) -> bool:
        import time  # lazy: placement only

        deadline = time.monotonic() + max(0.0, timeout)
        while True:  # polled, so the owner never holds a request open for it
            if self._pg("wait", hex_):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.02, left))

    def placement_group_remove(self, hex_: str) -> None:
        self._pg("remove", hex_)

    def placement_group_lookup(self, name: str):
        return self._pg("lookup", name)

    def placement_group_table(self) -> dict:
        return self._pg("table")

    def placement_group_bundles(self, hex_: str) -> list:
        return self._pg("bundles", hex_)

    def get_gpu_ids(self) -> list:
        task = self.task
        if task is not None:
            ids, as_ints = task.gpu_ids, task.gpu_ids_are_ints
        else:
            ids, as_ints = self.actor_gpu_ids
        if not ids:
            return []
        if as_ints:
            return [int(i) for i in ids]
        return list(ids)

    def assigned_resources(self) -> dict:
        task = self.task
        if task is not None:
            return dict(task.resources)
        return dict(self.actor_resources)

    # -- actors --------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        return self.info.get("namespace", "")

    def create_actor(self, spec) -> bytes:
        return self.call(protocol.CALL_CREATE_ACTOR, spec)

    def submit_actor_call(self, actor_id: bytes, call) -> None:
        with self._shielded():
            self.channel.send((protocol.ACTOR_SUBMIT, actor_id, call))

    def kill_actor(self, actor_id: bytes, no_restart: bool) -> None:
        self.call(protocol.CALL_KILL_ACTOR, actor_id, no_restart)

    def get_actor(self, name: str, namespace: str | None):
        return self.call(protocol.CALL_GET_ACTOR, name, namespace or self.namespace)

    def list_named_actors(self, all_namespaces: bool):
        return self.call(protocol.CALL_LIST_NAMED_ACTORS, all_namespaces, self.namespace)

    def actor_handle_event(self, actor_id: bytes, delta: int) -> None:
        """A handle to ``actor_id`` was made (+1), dropped (-1) or pickled (0) here: it
        goes to the owner with the next borrow report (``borrow_report``)."""
        self._ref_events.append((("actor", actor_id), delta))

    def is_canceled(self) -> bool:
        """Whether the running task or actor call was cancelled (Ray 2.60's checks)."""
        host = self.host
        if host is not None and host.loop is not None:
            raise RuntimeError("This method is not supported in an async actor.")
        task = self.task
        if task is None:
            return False
        if host is not None:
            return host.is_cancelled(task.task_id)
        with self.cancel_lock:
            return task.task_id in self.canceled

    host = None  # the ActorHost, once this worker hosts an actor
