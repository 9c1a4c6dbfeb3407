"""The node's side of results kept for remote drivers: booked, pulled, freed and fetched.

Owns: the methods of ``RemoteDrivers`` (a mixin of it: the links, the book of kept objects
and the loop are its, made in ``RemoteDrivers.__init__``) that serve steps 11 and 12 of
``remote_drivers.py``'s docstring: a link's "keeps"/"keep"/"free" (``_keeping``: the cap,
the book, the budget file; ``_worker_gone``: a dead worker's reservations given back),
the link's budget file's changes (``_budget``: tried with a bounded wait for its lock, and
on ``kept_budget.BudgetBusy`` kept in order and tried again from ``tick``, waiting
BUDGET_TICK_S at most per tick for all links together, so that workers stopped while they
hold the locks never stall the loop),
its pull connections (``pull``, ``_serve_pulls``: a thread each,
never the loop), another node's granted pull, and this node's fetch of an object another
node keeps (``_fetch``, ``_fetch_on_pull``, ``_fetch_thread``, ``_fetched``: a thread per
object and link, booked on the loop, given back when nobody waits), and the status rows of
what is kept (``kept_rows``). Does not own: the wire steps (``remote_drivers.py``'s
docstring), the book (``kept_objects.py``), the budget file (``object_store/kept_budget.py``),
the grant (``core/pull_grants.py``), or the frames (``transport/framing.py``).
Called by: ``RemoteDrivers`` (its loop's dispatch of a link's messages), ``peering.Peering``
(``pull`` for a pull connection, from the handshake gate), a fetch thread's end (posted to
the loop).
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time

from miniray._private.core import config, pull_grants
from miniray._private.transport import framing
from miniray._private.transport import peer_channel as pc
from miniray._private.transport.framing import send_in_frames

__all__ = ["BUDGET_RETRY_S", "BUDGET_TICK_S", "BUDGET_WAIT_S", "MAX_PULLS_PER_LINK",
           "PULL_SEND_TIMEOUT_S", "KeptServing", "fetch_shape", "lazy_budget", "lazy_segments",
           "peer_ip"]

logger = logging.getLogger(__name__)

PULL_SEND_TIMEOUT_S = 60.0  # one frame of a pulled value leaves within this
MAX_PULLS_PER_LINK = 8  # step 11: pull connections (threads) one driver may hold open
BUSY_READ_S = 2.0  # a pull refused as busy: its ask is read (no reset) this long at most
#                         (its driver uses 4 at most; a closed one's thread may linger)
BUDGET_WAIT_S = 0.005  # the loop waits at most this long for a budget file's lock (a
#                        worker holds it some 12 us); then the ops wait for a retry
BUDGET_RETRY_S = 0.05  # a link's budget ops that found the lock busy are tried this often
BUDGET_TICK_S = 0.01  # ``tick`` waits at most this long in all for busy budget files: the
#                       tags it did not reach are first at the next tick (the loop serves
#                       its sockets in between), so many stalled links never starve it


def peer_ip(channel: pc.PeerChannel) -> str:
    """The IP of a channel's peer (its ``address`` is ``ip:port``)."""
    return channel.address.rsplit(":", 1)[0]


class _PullAnswer:
    """Where the answer of a fetch asked on a pull connection goes (``_fetch_on_pull``'s
    thread waits on ``queue``), and that connection, to tell whether the driver still
    waits (``_peer_gone``)."""

    __slots__ = ("queue", "channel")

    def __init__(self, channel):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.channel = channel

    def __call__(self, reply) -> None:
        self.queue.put(reply)


def _peer_gone(answer: _PullAnswer) -> bool:
    """Whether the driver closed the pull connection ``answer`` came on: it stopped
    waiting (``peer_channel.closed_by_peer``)."""
    return pc.closed_by_peer(answer.channel)


def fetch_shape(args: tuple) -> bool:
    """Step 12's fetch arguments: ``(object_id, size, [ip, port], tag, grant)``."""
    object_id, size, address, tag, grant = args
    return (isinstance(object_id, bytes) and isinstance(size, int)
            and not isinstance(size, bool) and size > 0
            and isinstance(address, (list, tuple)) and len(address) == 2
            and isinstance(address[0], str) and isinstance(address[1], int)
            and isinstance(tag, str) and 8 <= len(tag) <= 24 and isinstance(grant, bytes))


def lazy_segments():
    """The store's segment module, lazy: a node loads it (and cloudpickle) only once a
    remote driver connects."""
    from miniray._private.object_store import shm_segments  # lazy: see above

    return shm_segments


def lazy_budget():
    """``object_store.kept_budget``, lazy as ``lazy_segments``."""
    from miniray._private.object_store import kept_budget  # lazy: see lazy_segments

    return kept_budget


def _receive_segment(channel: pc.PeerChannel, path: str, size: int) -> None:
    """Step 12's step 5: segment ``path`` (new) of ``size`` bytes, its pages reserved
    first, filled from ``channel``'s frames (``framing.receive_segment``); OSError for a
    frame late by PULL_SEND_TIMEOUT_S. The caller unlinks it on failure."""
    framing.receive_segment(channel, path, size, PULL_SEND_TIMEOUT_S, "the fetched value")


class KeptServing:
    """``RemoteDrivers``' steps 11 and 12 (see the module docstring); every attribute is the
    ``RemoteDrivers``'. A ``link`` is a ``remote_drivers._Link`` (not imported: that module
    imports this one)."""

    @property
    def shm_dir(self) -> str:
        if self._shm_dir is None:
            self._shm_dir = config.shm_dir()
        return self._shm_dir

    def kept_rows(self) -> list[dict]:
        """For ``miniray status`` (``node_stats.json``): per served link keeping anything,
        its driver's name, the objects and bytes kept and the cap."""
        rows = []
        for link in self._links.values():
            count, size = self.kept.totals(link)
            if count:
                rows.append({"driver": link.name, "objects": count, "bytes": size,
                             "cap": self.kept.cap_bytes})
        return sorted(rows, key=lambda row: row["driver"])

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _budget(self, tag: str | None, *ops: tuple) -> int | None:
        """The link's budget file takes ``ops`` (``kept_budget.apply_ops``) after those
        waiting for it, in order: the bytes given back, or None when its lock was busy
        (they wait, and ``_retry_budgets`` tries them again). Never waits on the loop
        longer than BUDGET_WAIT_S. Nothing for a dropped link (None: its file is gone)."""
        if tag is None:
            return 0
        self._budget_ops.setdefault(tag, []).extend(ops)
        if tag in self._budget_retry:  # ops wait already: these go after them
            return None
        return self._flush_budget(tag, time.monotonic())

    def _flush_budget(self, tag: str, now: float,
                      wait_s: float = BUDGET_WAIT_S) -> int | None:
        ops = self._budget_ops.pop(tag, [])
        budget = lazy_budget()
        try:
            given = budget.change(self.shm_dir, tag, ops, wait_s=wait_s)
        except budget.BudgetBusy as busy:
            if tag not in self._budget_retry:
                logger.warning("the budget file of link tag %s: %s; %d change(s) wait, "
                               "tried again every %g s", tag, busy, len(ops), BUDGET_RETRY_S)
            self._budget_ops[tag] = ops
            self._budget_retry[tag] = now + BUDGET_RETRY_S
            return None
        if self._budget_retry.pop(tag, None) is not None:
            logger.info("the budget file of link tag %s took the %d change(s) that waited",
                        tag, len(ops))
        return given

    def _retry_budgets(self, now: float) -> None:
        """From ``tick``: the budget ops that found their file's lock busy, tried again,
        those waiting longest first, waiting BUDGET_TICK_S at most in all (not per tag):
        a tag not reached keeps its past time, so it is first at the next tick, which the
        loop runs after serving its sockets (``next_deadline`` is due at once)."""
        due = sorted((when, tag) for tag, when in self._budget_retry.items() if when <= now)
        end = time.monotonic() + BUDGET_TICK_S
        for _when, tag in due:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._flush_budget(tag, now, min(BUDGET_WAIT_S, left))

    def _budget_deadline(self) -> float | None:
        return min(self._budget_retry.values(), default=None)

    def _forget_budget(self, tag: str) -> None:
        """The link was dropped: its file goes with its tag, and the ops waiting for it."""
        self._budget_ops.pop(tag, None)
        self._budget_retry.pop(tag, None)

    def _worker_gone(self, link, pid: int) -> None:
        """A worker of ``link`` exited: the reservations it made for results that never
        reached the book, and whose segments it never wrote, go back to the link's room
        (``kept_budget`` "reconcile", with the book's bytes: exact, under the file's lock,
        after the ops waiting for it)."""
        tag = self.kept.tag_of(link)
        if tag is None:
            return
        given = self._budget(tag, ("reconcile", self.kept.totals(link)[1], (pid,)))
        if given:
            logger.info("%s: gave back %d bytes reserved by its worker pid %d, which died "
                        "before its result was kept", link.name, given, pid)

    def _keeping(self, link, op: str, req, args):
        if op == "keeps":  # the cap: what this link's segments may hold in all
            return ("keeps", req, self.kept.tag_of(link), self.kept.cap_bytes)
        if op == "free":
            kept_before = self.kept.totals(link)[1]
            paths = self.kept.free(link, args[0])
            for path in paths:
                lazy_segments().unlink_quiet(path)
            if paths:  # unlinked first: a worker's reservation never outruns the memory
                self._budget(self.kept.tag_of(link),
                             ("release", kept_before - self.kept.totals(link)[1]))
                self._changed()
            return ("freed", req, len(paths))
        object_id, path, size = args
        why = self.kept.add(link, object_id, path, size)
        tag = self.kept.tag_of(link)
        if why is None:
            try:
                lazy_segments().check_adoptable(path, size, self.shm_dir, tag)
                # its worker's reservation becomes booked bytes
                self._budget(tag, ("book", object_id.hex(), size))
                self._changed()
                return ("kept", req)
            except (OSError, ValueError) as error:
                self.kept.free(link, [object_id])
                why = str(error)
        segments = lazy_segments()
        name = os.path.basename(str(path))
        if (segments.tag_of(name) == tag and os.path.dirname(path) == self.shm_dir):
            try:  # the object it is named for
                named = bytes.fromhex(name[len(f"mr_{tag}_"):])
            except ValueError:
                named = None
            # The link's own segment, refused: gone now, with its reservation; never the
            # file of an object kept already under that name (a second keep of it).
            if named is None or self.kept.find(link, named) is None:
                segments.unlink_quiet(path)
                if named is not None:
                    self._budget(tag, ("unreserve", named.hex(), None))
        self.errors += 1
        return ("error", req, "bad_segment", f"this node does not keep {path!r:.120}: {why}")

    def pull(self, channel: pc.PeerChannel) -> None:
        """Step 11: a pull connection of the link whose tag its hello names (from the
        handshake gate, on the loop); served by a thread of its own, never on the loop (a
        200 MB send would stall the heartbeats)."""
        link = self._by_tag.get(channel.peer_hello.get("tag"))
        if link is None or not self._served(link) or len(link.pulls) >= MAX_PULLS_PER_LINK:
            self.errors += 1
            logger.warning("refused a pull connection from %s: no driver link of its tag, "
                           "or %d pulls open already", channel.address, MAX_PULLS_PER_LINK)
            if link is not None and self._served(link):  # busy, not gone: said, so that
                threading.Thread(target=_say_busy, args=(channel,), daemon=True,  # it asks
                                 name="miniray-pull-busy").start()  # again later
            else:
                channel.close()
            return
        only = None
        peer = channel.peer_hello.get("peer")
        if peer is not None:  # step 12: another node, with its driver's grant
            only = peer.get("object_id")
            why = pull_grants.check_grant(link.grant_key, only, peer.get("node_id"),
                                          peer_ip(channel), peer.get("grant"))
            if why is not None:
                self.errors += 1
                logger.warning("refused a pull connection from %s for %s: %s",
                               channel.address, link.name, why)
                channel.close()
                return
        link.pulls.add(channel)
        threading.Thread(target=self._serve_pulls, args=(link, channel, only), daemon=True,
                         name="miniray-pull").start()

    def _serve_pulls(self, link, channel: pc.PeerChannel,
                     only: bytes | None = None) -> None:
        """Step 11's thread: ("pull", req, object_id) -> ("pulling", req, size) and the
        bytes in frames from the segment's read-only mapping, or ("error", req,
        "unknown_object", text). Reads the book without the loop (a dict lookup: an object
        freed meanwhile is either found, and its mapping outlives the unlink, or not)."""
        try:
            channel.setblocking(True)
            channel.set_send_timeout(PULL_SEND_TIMEOUT_S)
            while True:
                message = channel.recv(timeout=None)
                if (only is None and isinstance(message, tuple) and len(message) == 7
                        and message[0] == "fetch"):
                    if not self._fetch_on_pull(link, channel, message):
                        return
                    continue
                if (not isinstance(message, tuple) or len(message) != 3
                        or message[0] != "pull" or not isinstance(message[2], bytes)):
                    return  # not a driver of this version: the connection goes
                req, object_id = message[1], message[2]
                found = self.kept.find(link, object_id) if only in (None, object_id) \
                    else None  # another node's connection: its granted object only
                mapping = None
                if found is not None:
                    try:
                        mapping = lazy_segments().map_readonly(found[0])
                    except OSError:
                        mapping = None
                if mapping is None:
                    channel.send(("error", req, "unknown_object",
                                  f"this node keeps no object {object_id.hex()} for this "
                                  "driver (freed, or its link closed or was fenced)"))
                    continue
                try:
                    size = found[1]
                    channel.send(("pulling", req, size))
                    with memoryview(mapping) as whole, whole[:size] as view:
                        send_in_frames(channel.send_bytes, view)
                finally:
                    mapping.close()
        except (OSError, pc.PeerClosed, pc.PeerAuthError, TimeoutError, ValueError):
            pass
        finally:
            link.pulls.discard(channel)
            channel.close()

    def _fetch_on_pull(self, link, channel: pc.PeerChannel, message: tuple) -> bool:
        """Step 12's ask on one of the driver's own pull connections (its thread): the
        link's loop starts or joins the fetch (``_fetch``), this thread waits for its
        answer and sends it on this connection, so the driver's link is never held for
        the transfer. False: the connection goes (the link ended, or it broke)."""
        req = message[1]
        if not fetch_shape(message[2:]):
            channel.send(("error", req, "malformed", "a fetch names (object id: bytes, "
                          "size: int > 0, [ip, port], tag: str, grant: bytes)"))
            return True
        if self.post is None:
            channel.send(("error", req, "unsupported",
                          "this node fetches no object from another"))
            return True
        answers = _PullAnswer(channel)

        def start() -> None:  # on the loop
            reply = self._fetch(link, req, *message[2:], answer=answers)
            if reply is not None:
                answers(reply)

        self.post(start)
        while True:
            try:
                reply = answers.queue.get(timeout=1.0)
            except queue.Empty:
                if channel.closed or not self._served(link):
                    return False
                continue
            channel.send(reply)
            return True

    def _fetch(self, link, req, object_id: bytes, size: int, address, tag: str,
               grant: bytes, answer=None):
        """Step 12 on M (the loop): kept already, the answer; else a thread fetches it
        from N (one per object and link: later asks wait for its answer). ``answer``:
        the callable that takes the answer of an ask that came on a pull connection
        (``_fetch_on_pull``), instead of the link."""
        if not self._served(link):  # dropped meanwhile (asked on a pull connection)
            return ("error", req, "fetch_failed", "the driver's link closed meanwhile")
        found = self.kept.find(link, object_id)
        if found is not None:
            return ("fetched", req, found[0], found[1])
        if self.post is None or self.connect_pull is None:
            return ("error", req, "unsupported", "this node fetches no object from another")
        key = (link, object_id)
        waiting = self._fetching.get(key)
        if waiting is not None:
            waiting.append((req, answer))
            return None
        if sum(1 for other, _ in self._fetching if other is link) >= MAX_PULLS_PER_LINK:
            self.errors += 1
            return ("error", req, "fetch_failed",
                    f"this driver has {MAX_PULLS_PER_LINK} fetches running here already")
        cap = self.kept.cap_bytes
        link_tag = self.kept.tag_of(link)
        # A link whose budget changes wait is busy for this reservation too: one made
        # before them could be undone by a waiting "unreserve" of the same object.
        if cap is not None and (link_tag in self._budget_ops or not lazy_budget().reserve(
                self.shm_dir, link_tag, size, cap, object_id, wait_s=BUDGET_WAIT_S)):
            self.errors += 1  # counted as a worker's keep is: the driver sends it instead
            return ("error", req, "fetch_failed",
                    f"this driver's objects here would pass the node's cap of {cap} bytes "
                    "(MINIRAY_KEPT_BYTES_PER_DRIVER), or its budget file was busy")
        self._fetching[key] = [(req, answer)]
        path = os.path.join(self.shm_dir, lazy_segments().segment_name(link_tag, object_id))
        hello = {"driver": {"host": socket.gethostname(), "pid": self.node_pid}, "tag": tag,
                 "peer": {"node_id": self.node_id, "object_id": object_id, "grant": grant}}
        threading.Thread(target=self._fetch_thread,
                         args=(link, object_id, size, tuple(address), hello, path),
                         daemon=True, name="miniray-fetch").start()
        return None

    def _fetch_thread(self, link, object_id: bytes, size: int, address: tuple,
                      hello: dict, path: str) -> None:
        """Step 12's steps 3-5, off the loop; its end goes to the loop (``_fetched``)."""
        error = None
        try:
            channel = self.connect_pull(address, hello)
            try:
                channel.send(("pull", 1, object_id))
                answer = channel.recv(timeout=PULL_SEND_TIMEOUT_S)
                if not (isinstance(answer, tuple) and len(answer) == 3
                        and answer[0] == "pulling" and answer[2] == size):
                    raise LookupError(f"the node at {address[0]}:{address[1]} answered "
                                      f"{answer!r:.160}")
                _receive_segment(channel, path, size)
            finally:
                channel.close()
        except Exception as failure:  # noqa: BLE001 - the driver hears why
            lazy_segments().unlink_quiet(path)
            error = (f"fetching object {object_id.hex()} from {address[0]}:{address[1]} "
                     f"failed: {failure}")
        self.post(lambda: self._fetched(link, object_id, path, size, error))

    def _fetched(self, link, object_id: bytes, path: str, size: int,
                 error: str | None) -> None:
        """Step 12's step 6, on the loop: booked for the link and answered, or unlinked.
        Not booked when nobody waits for it any more (every ask came on a pull connection
        the driver closed: it gave up and sends the value itself, so a copy here would
        never be freed before the link ends)."""
        reqs = self._fetching.pop((link, object_id), [])
        tag = lazy_segments().tag_of(os.path.basename(path))  # the link's, kept if it is dropped
        if error is None and not self._served(link):
            error = "the driver's link closed meanwhile"
        if error is None and reqs and all(
                answer is not None and _peer_gone(answer) for _req, answer in reqs):
            error = "the driver stopped waiting for it"
        if error is None:
            error = self.kept.add(link, object_id, path, size)
        if error is not None:
            if self.kept.find(link, object_id) is None:
                lazy_segments().unlink_quiet(path)
            # its reservation (_fetch, with a cap) goes back
            self._budget(tag, ("unreserve", object_id.hex(), os.getpid()))
            self.errors += 1
            logger.info("%s: %s", link.name, error)
        else:
            self._budget(tag, ("book", object_id.hex(), size))
            self.fetched += 1
        for req, answer in reqs:
            reply = ("fetched", req, path, size) if error is None else \
                ("error", req, "fetch_failed", error)
            if answer is not None:  # asked on a pull connection: its thread sends it
                answer(reply)
            elif self._served(link) and not self._reply(link, reply):
                return


def _say_busy(channel: pc.PeerChannel) -> None:
    """A pull connection of a link whose pulls are all taken: its first ask is read (so
    that closing resets nothing the puller has not read) and answered ``("error", req,
    "busy", why)``, which a granted puller asks again after (any other close is final for
    it: the link or the object gone); then closed. At most BUSY_READ_S."""
    try:
        ask = channel.recv(timeout=BUSY_READ_S)
        req = ask[1] if isinstance(ask, tuple) and len(ask) > 1 else 0
        channel.send(("error", req, "busy", f"this link's {MAX_PULLS_PER_LINK} pulls "
                      "are all taken; ask again"))
    except Exception:  # noqa: BLE001 - it went meanwhile: nothing to say
        pass
    finally:
        channel.close()
