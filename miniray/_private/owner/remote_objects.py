"""Results of tasks on other nodes that stay there until needed (issue 16; design and
protocol: docs/remote-objects.md, the node's half: ``node/remote_drivers.py`` step 11).

Owns: the driver's side of kept results: booking a worker's ``("kept", path, size)`` result
on its node (``keep_results``) and handing the owner a ``RemoteCopy`` for it, the pull of
such a value into a segment of the driver's store when its first waiter appears (a thread
per pull, at most PULLS_PER_NODE at once per node, idle ``pull`` connections kept per
link; room made as for a put, else ObjectStoreFullError for the waiters of then and a new
pull for the next reader; ended with ObjectLostError once the view holds the node dead, a
watcher thread looking every LIVENESS_S while pulls are in flight), a node-to-node fetch
(``fetch``: another node gets the value from the one that keeps it, with this driver's
grant, ``core/pull_grants.py``, asked on a pull connection of that node's link, never the
link itself; freed with the object), the frees of the node's copies the owner's frees
queue (sent in batches by a thread, never under the owner's lock), and results that the
node's actor service keeps on a node for this driver's calls (``hand_on`` in the service:
its link's grant of one object to the caller; ``granted_copy`` in the caller: pulled as
its own, on a connection carrying that grant, ``_Granted``; docs/remote-objects.md,
"Results of the actor service's actors"). Does not own: the
entry's state (``object_table``:
a PENDING entry with a ``RemoteCopy``, made READY by ``set_ready``), the link
(``transport/remote_node.RemoteNodeClient``: ``keeps``, ``keep``, ``free``,
``open_pull``), running the task (``remote_nodes.RemoteNodes``, step 7 of its docstring).
Called by: ``RemoteNodes`` (``keep_results``, ``drop_results`` and ``fetch`` in a task's
thread, not locked; ``close`` at shutdown), ``remote_actors.RemoteActors`` (the same for
an actor's calls and results, in its threads; ``drop_kept`` locked; ``grant_key`` for
the actor service's workers), the actor service (``hand_on``, locked),
``actor_service_proxies`` (``granted_copy``, locked) and the object
table's ``RemoteCopy`` hooks (locked: they only hand work to a thread after the lock,
``owner.defer``).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
import time

from miniray._private.core import protocol, pull_grants, serialization
from miniray._private.host import auth_token
from miniray._private.object_store import shm_segments
from miniray._private.owner.object_table import PENDING, RemoteCopy
from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake
from miniray._private.transport.remote_node import (
    DEFAULT_TIMEOUT_S,
    ROLE_PULL,
    RemoteLeaseError,
    RemoteNodeClient,
)

__all__ = ["PULLS_PER_NODE", "KeepRefused", "KeptResults"]

logger = logging.getLogger(__name__)

PULLS_PER_NODE = 4  # pulls at once from one node (it serves up to 8 per link)
LIVENESS_S = 0.5  # a pull in flight looks its node up in the view this often
OPEN_SLICE_S = 2.0  # a pull connection's handshake unanswered this long: N looked up
GRANTED_TRIES = 10  # a granted pull N answered "busy" (its link's pulls were all taken:
GRANTED_RETRY_S = 0.2  # MAX_PULLS_PER_LINK) is asked again this often, this far apart
GRANTED_RETRY_MAX_S = 2.0  # at first, doubling up to this (about 13 s in all); then the
# waiters of now get the error and the next reader pulls again (``RemoteCopy.again``)


class _Busy(ConnectionError):
    """N answered a granted pull "busy": its link's pulls were all taken."""


class _Kept:
    """What ``RemoteNodes.node_lost`` reads of a worker: the node and its incarnation."""

    __slots__ = ("node", "incarnation")

    def __init__(self, node: str, incarnation: int | None):
        self.node = node
        self.incarnation = incarnation


class _Granted:
    """Where ``KeptResults._pull`` reads a result that another owner keeps on node N for
    this driver (a call of an actor of the node's actor service: the service's link to N
    keeps it, ``node/actor_service.py``): N's address, that link's tag, and the service's
    grant of this one object to this driver's node id and IP (``core/pull_grants.py``).
    It stands where ``_pull`` reads a ``RemoteNodeClient`` (``open_pull``, ``kept``,
    ``lost``, ``node_dead``, ``name``, ``timeout``); a granted connection pulls that object
    only, so it is never kept idle (``granted``)."""

    granted = True

    def __init__(self, address: tuple, tag: str, object_id: bytes, grant: bytes,
                 node_id: str, source_ip: str, timeout: float):
        self.address = (str(address[0]), int(address[1]))
        self.name = f"{self.address[0]}:{self.address[1]}"
        self.kept = (tag, 0)
        self.timeout = timeout
        self.lost: str | None = None
        self._peer = {"node_id": node_id, "object_id": object_id, "grant": grant}
        self._source_ip = source_ip

    def node_dead(self, reason: str) -> None:
        if self.lost is None:
            self.lost = f"the cluster holds the node at {self.name} dead ({reason})"

    def open_pull(self, tag: str, timeout: float | None = None) -> pc.PeerChannel:
        """A pull connection to N with the grant (``remote_drivers`` step 12's hello)."""
        contexts = peer_handshake.tls_contexts()  # (client, server) where TLS is on
        channel = peer_handshake.connect(
            self.address, auth_token.load_token(), ROLE_PULL,
            hello={"driver": {"host": socket.gethostname(), "pid": os.getpid()}, "tag": tag,
                   "peer": self._peer},
            timeout=self.timeout if timeout is None else timeout,
            ssl_context=contexts[0] if contexts else None,
            source_address=(self._source_ip, 0))
        channel.set_send_timeout(self.timeout)
        return channel


class KeepRefused(Exception):
    """The node did not keep a task's result (the text says why): the task fails as a
    system error (``RemoteNodes``)."""


class KeptResults:
    """The driver's kept results on other nodes (see the module docstring).

    ``receive_segment(channel, path, size)`` and ``receive_frames(channel, mapping,
    size)``: ``remote_nodes``' receivers of a value's frames (a new segment, a recycled
    one's mapping), OSError for a frame late by ``frame_s``."""

    def __init__(self, nodes, receive_segment, receive_frames, frame_s: float):
        self.nodes = nodes  # the RemoteNodes: its ``_closed``
        self.owner = nodes.owner
        self._receive_segment = receive_segment
        self._receive_frames = receive_frames
        self._frame_s = frame_s
        self.pulled = 0  # values pulled from the nodes that kept them
        self.fetched = 0  # values another node fetched from the one that kept them
        self._lock = threading.Lock()  # the fields below; never held while waiting
        self._pulls: dict[RemoteNodeClient, list] = {}  # idle pull connections per link
        self._pull_slots: dict[RemoteNodeClient, threading.BoundedSemaphore] = {}
        # pull channel in flight -> (client, node id, incarnation): ``_watch``
        self._active: dict = {}
        self._lost_why: dict = {}  # pull channel closed by the watcher -> why
        self._watching = False  # a _watcher thread runs
        # Node-to-node fetches (``fetch``): the link each kept object is on (popped when
        # it is freed), each node's other copies ``{object id: {node id: (link, path)}}``,
        # each link's grant key, one lock per (object, node) fetched.
        self._homes: dict[bytes, RemoteNodeClient] = {}
        self._copies: dict[bytes, dict[str, tuple]] = {}
        self._grant_keys: dict[RemoteNodeClient, bytes] = {}
        self._fetching: dict[tuple, threading.Lock] = {}
        self._frees_lock = threading.Lock()  # the two fields below; taken under the owner's
        self._frees: dict[RemoteNodeClient, list] = {}
        self._freeing = False  # a _send_frees thread runs

    def close(self) -> None:
        """*Not locked.* Close the idle pull connections (the links' close frees the rest:
        each node sweeps what it keeps for its link)."""
        with self._lock:
            pulls = [c for channels in self._pulls.values() for c in channels]
            self._pulls.clear()
            self._grant_keys.clear()
        for channel in pulls:
            channel.close()

    def forget_link(self, client: RemoteNodeClient) -> None:
        """*Not locked.* ``client``'s link was lost and a new one replaces it: drop its grant
        key and pull slots and close its idle pull connections (its kept objects are gone
        with it: they fail as lost when read)."""
        with self._lock:
            pulls = self._pulls.pop(client, [])
            self._pull_slots.pop(client, None)
            self._grant_keys.pop(client, None)
        for channel in pulls:
            channel.close()

    def keep_results(self, client: RemoteNodeClient, node_id: str, spec,
                     items: list) -> list:
        """Each ``("kept", path, size)`` result: N keeps it for this link (("keep", ...));
        the owner gets ``("remote", RemoteCopy)`` for it, pulled when someone waits. A
        refusal raises KeepRefused (N unlinked the segment and gave its room back); the
        copies kept so far are freed, and so are the later results, kept there or
        received here (``_give_back``: else they stayed, counted against the link's cap
        until it closed, or in this store's directory until shutdown)."""
        out = []
        try:
            for index, item in enumerate(items):
                payload = item[1]
                if type(payload) is tuple and payload[0] == "kept":
                    object_id = spec.return_ids[index]
                    try:
                        client.keep(object_id, payload[1], payload[2])
                    except RemoteLeaseError as refused:
                        self._give_back(client, spec, items, index + 1)
                        raise KeepRefused(
                            f"Task {spec.name}: its result could not stay on node "
                            f"{client.name}: {refused}") from None
                    item = (item[0], ("remote", self._copy(
                        client, node_id, object_id, payload[2], payload[1]))) + tuple(item[2:])
                out.append(item)
        except BaseException:
            self.drop_results(out)
            raise
        return out

    def _give_back(self, client: RemoteNodeClient, spec, items: list, start: int) -> None:
        """*Not locked.* After a refused keep: the results from ``start`` on that the
        worker kept on N (written, and reserved in the link's budget) are booked and freed
        at once with the link's own "keep" and "free" (N unlinks them and gives their room
        back now); one N refuses it unlinked and gave back itself. The link lost
        meanwhile: they go with its tag's sweep. The later results that came here as
        values (a segment received into this store) are given up too."""
        booked = []
        for index in range(start, len(items)):
            payload = items[index][1]
            if type(payload) is tuple and payload[0] == "shm":
                self.owner.store.give_up_recycled(payload[1])
            if not (type(payload) is tuple and payload[0] == "kept"):
                continue
            try:
                client.keep(spec.return_ids[index], payload[1], payload[2])
            except RemoteLeaseError:
                continue  # refused: unlinked and given back by N
            except Exception as error:  # noqa: BLE001 - the link is lost: N sweeps its tag
                logger.debug("giving back the results of %s on %s: %s", spec.name,
                             client.name, error)
                break
            booked.append(spec.return_ids[index])
        if booked:
            try:
                client.free(booked)
            except Exception as error:  # noqa: BLE001 - as above
                logger.debug("freeing the results of %s on %s: %s", spec.name, client.name,
                             error)

    def drop_results(self, items: list) -> None:
        """Results nobody adopted: segments here unlinked, copies on N freed."""
        for item in items:
            payload = item[1]
            if type(payload) is tuple and payload[0] == "remote":
                payload[1].free()
            elif type(payload) is tuple:
                self.owner.store.give_up_recycled(payload[1])

    def drop_kept(self, items: list) -> None:
        """*Locked.* The kept copies among results nobody adopted (a call that ended
        meanwhile) are freed on their nodes (after the lock)."""
        for item in items:
            payload = item[1]
            if type(payload) is tuple and payload[0] == "remote":
                payload[1].free()

    def _copy(self, client: RemoteNodeClient, node_id: str, object_id: bytes,
              size: int, path: str = "") -> RemoteCopy:
        # N's incarnation now (a task's worker on N was spawned in it): a pull in flight
        # ends when the view holds N dead or back as another one (``_watch``).
        incarnation = next((e.incarnation for e in self.nodes.last_view()
                            if e.node_id == node_id), None)

        def start():  # locked (a waiter was added): the pull runs on a thread of its own
            self.owner.defer(lambda: threading.Thread(
                target=self._pull, args=(client, object_id, copy, incarnation), daemon=True,
                name="miniray-pull").start())

        def free():  # locked: sent after it, with others, by ``_send_frees``
            with self._lock:  # its copies fetched by other nodes go too
                self._homes.pop(object_id, None)
                others = self._copies.pop(object_id, {})
            with self._frees_lock:
                self._frees.setdefault(client, []).append(object_id)
                for other, _path in others.values():
                    self._frees.setdefault(other, []).append(object_id)
                if self._freeing:
                    return
                self._freeing = True
            self.owner.defer(lambda: threading.Thread(
                target=self._send_frees, daemon=True, name="miniray-remote-free").start())

        copy = RemoteCopy(node_id, size, start, free, path)
        with self._lock:
            self._homes[object_id] = client
        return copy

    # -- results the node's actor service keeps for this driver's calls ----------------
    def grant_key(self, client: RemoteNodeClient, timeout: float | None = None) -> bytes:
        """*Not locked.* ``client``'s link's grant key (asked once, a round trip of at most
        ``timeout`` seconds (None: the link's), then cached while the link is not lost).
        Raises LookupError when it cannot be had."""
        with self._lock:
            key = self._grant_keys.get(client)
        if key is not None:
            return key
        from miniray.exceptions import NodeDiedError  # lazy: the public package

        try:
            key = client.grant_key(timeout)
        except (NodeDiedError, RemoteLeaseError, OSError, TimeoutError) as lost:
            raise LookupError(f"the node at {client.name}: {lost}") from None
        with self._lock:
            if client.lost is None:  # a lost link's would stay (``forget_link``)
                self._grant_keys[client] = key
        return key

    def keep_segment(self, client: RemoteNodeClient, node_id: str, object_id: bytes,
                     path: str, size: int) -> RemoteCopy:
        """*Not locked.* A segment this process wrote into node ``node_id``'s shm dir as
        ``mr_<client's tag>_<object id>`` (its bytes reserved in the link's budget file
        first) is booked there for ``client``'s link, as a worker's kept result is: its
        ``RemoteCopy``, freed through the link. KeepRefused: the node refused it (and
        unlinked it)."""
        try:
            client.keep(object_id, path, size)
        except (RemoteLeaseError, OSError, TimeoutError) as refused:
            raise KeepRefused(f"the node at {client.name} did not keep {path}: "
                              f"{refused}") from None
        except Exception as refused:  # noqa: BLE001 - NodeDiedError: the link is lost
            raise KeepRefused(f"the node at {client.name} is lost: {refused}") from None
        return self._copy(client, node_id, object_id, size, path)

    def hand_on(self, object_id: bytes, node_id: str, ip: str) -> tuple | None:
        """For the node's actor service, which keeps a call's result on N through its
        link and hands the result on to the calling driver: N's ``[ip, port]``, the
        link's tag and the grant of ``object_id`` to the driver's node ``node_id`` at
        ``ip``, which that driver pulls with (``granted_copy``); None when the link is
        lost, its grant key was never asked (``grant_key``) or the driver named no node.
        Any thread."""
        with self._lock:
            home = self._homes.get(object_id)
            key = self._grant_keys.get(home) if home is not None else None
        if key is None or home.lost is not None or home.kept is None or not node_id:
            return None
        return ([home.address[0], int(home.address[1])], home.kept[0],
                pull_grants.grant(key, object_id, node_id, ip))

    def granted_copy(self, object_id: bytes, node_id: str, size: int, path: str,
                     address, tag: str, grant: bytes, free) -> RemoteCopy:
        """*Locked.* The ``RemoteCopy`` of a result another owner keeps on node
        ``node_id`` for this driver (``hand_on``'s answer): pulled on the first waiter,
        as this driver's own kept results are (``_pull``, on a connection that carries
        the grant); ``free`` (locked) tells that owner when this driver frees it."""
        nodes = self.nodes
        incarnation = next((e.incarnation for e in nodes.last_view()
                            if e.node_id == node_id), None)
        source = _Granted(address, tag, object_id, grant, nodes.local, nodes.source_ip,
                          DEFAULT_TIMEOUT_S)

        def start():  # locked (a waiter was added): the pull runs on a thread of its own
            self.owner.defer(lambda: threading.Thread(
                target=self._pull, args=(source, object_id, copy, incarnation), daemon=True,
                name="miniray-pull").start())

        copy = RemoteCopy(node_id, size, start, free, path)
        return copy

    def fetch(self, object_id: bytes, copy: RemoteCopy, client: RemoteNodeClient,
              entry) -> str:
        """*Not locked.* Node ``entry`` (``client``: this driver's link to it) gets the
        kept object straight from the node that keeps it (``remote_drivers`` step 12, with
        this driver's grant); the path of its copy there, which the object's free frees
        too. Once per object and node (later calls wait for the first). LookupError: the
        keeping node's link is gone; RemoteLeaseError "fetch_failed": the node could not
        (the caller pulls it through this driver instead); NodeDiedError, TimeoutError:
        node ``entry`` is lost."""
        node = entry.node_id
        with self._lock:
            home = self._homes.get(object_id)
            done = self._copies.get(object_id, {}).get(node)
            if done is not None and done[0] is not client:  # that link went, its copy too
                del self._copies[object_id][node]
                done = None
            if done is not None:
                return done[1]
            if home is None or home.lost is not None or home.kept is None:
                raise LookupError(f"the link that keeps object {object_id.hex()} is gone")
            # One fetch per object and node: later callers wait on its gate; the entry
            # goes when that fetch ends, however it ends (only the gate made here).
            gate = self._fetching.setdefault((object_id, node), threading.Lock())
        try:
            return self._fetch_once(object_id, copy, client, entry, home, gate)
        finally:
            with self._lock:
                if self._fetching.get((object_id, node)) is gate and not gate.locked():
                    del self._fetching[(object_id, node)]

    def _fetch_once(self, object_id: bytes, copy: RemoteCopy, client: RemoteNodeClient,
                    entry, home: RemoteNodeClient, gate) -> str:
        """``fetch`` under the object's and node's ``gate``: M's copy if a caller before
        made it, else one fetch (grant, ask on a pull connection of M's link)."""
        node = entry.node_id
        with gate:
            with self._lock:
                done = self._copies.get(object_id, {}).get(node)
            if done is not None and done[0] is client:
                return done[1]
            key = self.grant_key(home)  # LookupError: the node that keeps it is lost
            grant = pull_grants.grant(key, object_id, node, entry.ip)
            path = self._ask_fetch(client, object_id, copy.size, home, grant)
            with self._lock:
                freed = object_id not in self._homes
                if not freed:
                    self._copies.setdefault(object_id, {})[node] = (client, path)
                self.fetched += 1
            if freed:  # freed while it was fetched: that copy goes too
                with self._frees_lock:
                    self._frees.setdefault(client, []).append(object_id)
                    start = not self._freeing
                    self._freeing = True
                if start:
                    threading.Thread(target=self._send_frees, daemon=True,
                                     name="miniray-remote-free").start()
            return path

    def _ask_fetch(self, client: RemoteNodeClient, object_id: bytes, size: int,
                   home: RemoteNodeClient, grant: bytes) -> str:
        """``fetch``'s ask, on a pull connection of ``client``'s link (one of its pull
        slots), never on the link itself: the node answers there once its copy is made,
        and the link's leases and spawns go on meanwhile. RemoteLeaseError
        "fetch_failed": the node could not, or the connection broke (the caller pulls it
        through this driver instead)."""
        slots = self._slots(client)
        slots.acquire()
        try:
            try:
                channel = self._pull_channel(client, client.node_id, None)
            except (LookupError, TimeoutError) as failed:
                raise RemoteLeaseError(str(failed), kind="fetch_failed") from None
            self._watch(channel, client, client.node_id, None)  # M cut off: ends the wait
            try:
                channel.send(("fetch", 1, object_id, int(size),
                              [home.address[0], int(home.address[1])], home.kept[0], grant))
                answer = channel.recv(timeout=self._frame_s + size / (20 << 20))
            except BaseException as failed:
                channel.close()
                lost = self._unwatch(channel)
                if isinstance(failed, Exception):
                    raise RemoteLeaseError(f"the node at {client.name} did not answer the "
                                           f"fetch: {lost or repr(failed)[:200]}",
                                           kind="fetch_failed") from None
                raise
            self._unwatch(channel)
            if (type(answer) is tuple and len(answer) == 4 and answer[0] == "fetched"
                    and answer[3] == size and isinstance(answer[2], str)):
                self._pull_idle(client, channel)
                return answer[2]
            if type(answer) is tuple and len(answer) == 4 and answer[0] == "error":
                self._pull_idle(client, channel)
                raise RemoteLeaseError(f"the node at {client.name} refused 'fetch': "
                                       f"{answer[3]}", kind=str(answer[2]))
            channel.close()
            raise RemoteLeaseError(f"the node at {client.name} answered the fetch with "
                                   f"{answer!r:.120}", kind="fetch_failed")
        finally:
            slots.release()

    def _send_frees(self) -> None:
        """Step 7's frees, batched per link, never under the owner's lock. A lost link's
        are dropped: N swept them with the link."""
        while True:
            with self._frees_lock:
                batch, self._frees = self._frees, {}
                if not batch:
                    self._freeing = False
                    return
            for client, object_ids in batch.items():
                if client.lost is not None or self.nodes.closed:
                    continue
                for start in range(0, len(object_ids), 4096):
                    try:
                        client.free(object_ids[start:start + 4096])
                    except Exception as error:  # noqa: BLE001 - N lost: swept with the link
                        logger.debug("freeing kept objects on %s failed: %s", client.name,
                                     error)
                        break

    def _pull(self, client: RemoteNodeClient, object_id: bytes, copy: RemoteCopy,
              incarnation: int | None = None) -> None:
        """Step 7's pull, on its own thread (never the I/O thread, never locked): the
        value's bytes from N's segment on a pull connection of this link, straight into a
        segment of this store (a freed one of its pool when one fits, else a new one once
        the store made room), then READY; N or its link lost (the view holding N dead
        included: ``_watch``), or N keeping no such object: ObjectLostError naming N; no
        room here (ObjectStoreFullError; a spill's OutOfDiskError; ENOSPC receiving): that
        error for the waiters of now, pulled again by the next reader
        (``RemoteCopy.again``), as after a granted pull N kept refusing (its link's pulls
        all taken by other callers). Waiters are woken either way."""
        owner = self.owner
        store = owner.store
        path = error = channel = lost = no_room = None
        busy = False  # a granted pull N refused every time: not lost, asked again later
        size = copy.size
        slots = self._slots(client)
        slots.acquire()  # more at once wait here: N serves a few per link
        try:
            recycled = store.recycled_for(object_id, size)
            if recycled:
                path = recycled[0]
            else:  # nothing asked of N yet when this fails
                try:
                    store.make_room(object_id, size)
                except Exception as failure:  # ObjectStoreFullError; a spill that failed
                    no_room = failure
                    raise
            granted = getattr(client, "granted", False)
            tries, pause = (GRANTED_TRIES if granted else 1), GRANTED_RETRY_S
            while True:
                tries -= 1
                channel = self._pull_channel(client, copy.node_id, incarnation)
                self._watch(channel, client, copy.node_id, incarnation)
                try:
                    channel.send(("pull", 1, object_id))
                    answer = channel.recv(timeout=self._frame_s)
                    if (granted and type(answer) is tuple and len(answer) == 4
                            and answer[0] == "error" and answer[2] == "busy"):
                        raise _Busy(f"{client.name} refused the pull: {answer[3]}")
                    break
                except BaseException as failed:
                    channel.close()
                    lost = self._unwatch(channel)
                    # N said its link's pulls are all taken (kept_serving step 11): asked
                    # again (GRANTED_TRIES); any other failure is final
                    refused = isinstance(failed, _Busy) and lost is None
                    if not refused or tries <= 0:
                        busy = refused
                        raise
                time.sleep(pause)
                pause = min(pause * 2, GRANTED_RETRY_MAX_S)
            try:
                if not (type(answer) is tuple and len(answer) == 3 and answer[0] == "pulling"
                        and answer[2] == size):
                    raise LookupError(str(answer[3] if type(answer) is tuple
                                          and len(answer) == 4 else answer)[:200])
                if recycled:
                    self._receive_frames(channel, recycled[1], size)
                else:
                    path = os.path.join(store.shm_dir, shm_segments.segment_name(
                        store.session_tag, object_id))
                    self._receive_segment(channel, path, size)
            except BaseException:
                channel.close()
                raise
            finally:
                lost = self._unwatch(channel)
            # Every byte came (MAC-checked): the value is whole, even if the view held N
            # dead meanwhile (then the channel is closed, not kept idle).
            self._pull_idle(client, channel)
        except OSError as failure:
            if no_room is None and failure.errno in (errno.ENOSPC, errno.ENOMEM):
                no_room = shm_segments.no_room_error(store.shm_dir, size, object_id)
            error = no_room or self._lost(client, copy, object_id, lost or failure)
        except Exception as failure:  # noqa: BLE001 - N, its link or the object gone
            error = no_room or self._lost(client, copy, object_id, lost or failure)
        finally:
            slots.release()
        if error is not None and path is not None:
            store.give_up_recycled(path)
            path = None
        with owner.locked():
            entry = owner.objects.get(object_id)
            if entry is not None and entry.remote is copy and entry.state == PENDING:
                if error is not None:
                    if error is no_room or busy:  # N still has it: the next reader
                        copy.again = entry.kind  # pulls again
                    owner.objects.set_ready(object_id, protocol.ERR,
                                            serialization.dumps(error))
                else:
                    owner.objects.set_ready(object_id, entry.kind, ("shm", path, size))
                    self.pulled += 1
                path = None
        if path is not None:  # freed while it was pulled
            store.give_up_recycled(path)

    def _lost(self, client: RemoteNodeClient, copy: RemoteCopy, object_id: bytes,
              failure) -> Exception:
        """The ObjectLostError of a pull that failed (``failure``: the exception, or why
        the watcher ended it), naming N and why."""
        from miniray.exceptions import ObjectLostError  # lazy: this path only

        why = failure if isinstance(failure, str) else (
            client.lost or f"{type(failure).__name__}: {failure}")
        logger.info("pulling object %s from %s failed: %s", object_id.hex()[:16],
                    client.name, why)
        error = ObjectLostError(object_id.hex(), self.owner.hello_info.get("node_ip"), "")
        error.lost_on = (f"It was kept on node {copy.node_id[:12] or '?'} at {client.name}; "
                         f"pulling it failed: {str(why)[:300].rstrip('.')}")
        return error

    # -- a pull in flight ends when the view holds its node dead ------------------------
    def _watch(self, channel, client: RemoteNodeClient, node_id: str,
               incarnation: int | None) -> None:
        """While ``channel`` pulls, ``_watcher`` looks N up in the view every LIVENESS_S:
        held dead (or back as a new incarnation: a partition, its sockets open), the
        channel is closed, which ends the pull's wait at once (ObjectLostError)."""
        with self._lock:
            self._active[channel] = (client, node_id, incarnation)
            if self._watching:
                return
            self._watching = True
        threading.Thread(target=self._watcher, daemon=True,
                         name="miniray-pull-watch").start()

    def _unwatch(self, channel) -> str | None:
        """The pull on ``channel`` ended: why the watcher closed it, if it did."""
        with self._lock:
            self._active.pop(channel, None)
            return self._lost_why.pop(channel, None)

    def _watcher(self) -> None:
        while True:
            time.sleep(LIVENESS_S)
            with self._lock:
                if not self._active or self.nodes.closed:
                    self._watching = False
                    return
                active = list(self._active.items())
            verdicts: dict = {}
            for channel, key in active:
                if key not in verdicts:
                    verdicts[key] = self._node_lost(*key)
                why = verdicts[key]
                if why is not None:
                    with self._lock:
                        if channel not in self._active:
                            continue
                        self._lost_why[channel] = why
                    channel.close()  # shuts the socket down: the pull's recv wakes

    def _node_lost(self, client: RemoteNodeClient, node_id: str,
                   incarnation: int | None) -> str | None:
        """Why N is lost (its link, or the view: ``RemoteNodes.node_lost``), else None. An
        incarnation not known when the result was kept: only N's death counts."""
        if client.lost is not None:
            return client.lost
        if incarnation is None:
            incarnation = next((e.incarnation for e in self.nodes.view()
                                if e.node_id == node_id), None)
            if incarnation is None:
                return None
        return self.nodes.node_lost(_Kept(node_id, incarnation), client)

    def _pull_channel(self, client: RemoteNodeClient, node_id: str,
                      incarnation: int | None):
        """An idle pull connection of ``client``'s link, or a new one. A handshake N does
        not answer (cut off, stopped) is tried again every OPEN_SLICE_S until the view
        holds N dead (LookupError) or the link's timeout passed (TimeoutError)."""
        with self._lock:
            idle = self._pulls.get(client)
            if idle:
                return idle.pop()
        if client.kept is None:
            raise LookupError("the link keeps nothing")
        deadline = time.monotonic() + client.timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return client.open_pull(client.kept[0], timeout=max(0.1, min(OPEN_SLICE_S,
                                                                             left)))
            except TimeoutError:
                why = self._node_lost(client, node_id, incarnation)
                if why is not None:
                    raise LookupError(why) from None
                if time.monotonic() >= deadline:
                    raise

    def _pull_idle(self, client: RemoteNodeClient, channel) -> None:
        with self._lock:
            if not self.nodes.closed and client.lost is None and \
                    not getattr(client, "granted", False):
                idle = self._pulls.setdefault(client, [])
                if len(idle) < PULLS_PER_NODE:
                    idle.append(channel)
                    return
        channel.close()

    def _slots(self, client: RemoteNodeClient) -> threading.BoundedSemaphore:
        """The pull slots of ``client``'s link: kept while the link is not lost (a lost
        one's, replaced by a new link, went with ``forget_link``; a late reader's slots
        are its own, its pull fails as lost)."""
        key = ("granted", client.address) if getattr(client, "granted", False) else client
        with self._lock:  # granted pulls (``_Granted``): one set of slots per node
            slots = self._pull_slots.get(key)
            if slots is None:
                slots = threading.BoundedSemaphore(PULLS_PER_NODE)
                if client.lost is None:
                    self._pull_slots[key] = slots
            return slots
