"""Workers' log files in the session directory: capped, rotated, found and read back.

Owns: the layout of ``<session>/logs/`` (``worker-<pid>.out`` / ``.err``, their one rotated
generation ``.1``, and ``actor-<actor id hex>``, the pids that hosted an actor, one a line);
writing a worker's output there within a cap (``CappedLog``); recording which pid hosts an
actor (``note_actor``, by the worker itself at ACTOR_INIT); finding and reading logs for
``miniray logs`` and the state API (``find_worker_logs``, ``find_actor_pids``, ``read_text``,
``names_by_kind``, ``find_log``) or following them (``follow``, ``follow_step``), and the
answer a node gives another host's state API (``answer_query``: ``remote_drivers.py`` step
13, read-only, bounded).
A remote driver's worker (one a driver on another host runs on this node) has its files
here too, in the node's session: ``LogTee`` is what the node's relay thread
(``transport/tls_relay.py``) hands each chunk it copies from the worker's stdout or stderr
to the driver, before the pid is known (kept, as ``OutputStream`` keeps it) and after.
Does not own: reading the workers' pipes (``owner/output.py``, which hands each chunk it
reads to the stream's ``CappedLog``; for a remote driver's worker the relay) or the session
directory's lifetime (``session.py``: the logs go with it).

Cost on the output path: one ``os.write`` of each chunk the driver already read from the
pipe (no extra copy, no lock), and a rename each ``cap`` bytes. ``MINIRAY_WORKER_LOG_BYTES``
is the cap per file (default 1 MiB; 0: no log files), so a worker keeps at most twice that
per stream.

Mirrors Ray's ``worker-*.out``/``.err`` files (Ray 2.60 names them by worker id, job id and
pid, and rotates them by size too); markers in the raw output (task names, progress bars) are
turned into readable lines or dropped when read.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

from miniray._private.host import same_uid

__all__ = ["CappedLog", "LOGS_DIR", "LogTee", "MAX_ANSWER_CHARS", "answer_query",
           "find_actor_pids", "find_log", "find_named", "find_worker_logs", "follow",
           "follow_step", "listing", "log_path", "names_by_kind", "note_actor", "read_from",
           "read_text", "session_dirs"]

LOGS_DIR = "logs"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_TASK_MARKER = re.compile(r"^\x00mr:(\d+):(.*)$")
_BAR_MARKER = "\x00mb:"
MAX_ANSWER_CHARS = 1 << 20  # a log read for another host: its last 1 Mi characters at most
MAX_ANSWER_NAMES = 10000  # file names listed for another host
_MARKER_START = re.compile(r"(?=\x00m[rb]:)")


def log_path(session_dir: str, pid: int, err: bool) -> str:
    return os.path.join(session_dir, LOGS_DIR, f"worker-{pid}.{'err' if err else 'out'}")


def ensure_logs_dir(session_dir: str) -> str:
    """``<session>/logs``, a private directory of this user (created if missing)."""
    folder = os.path.join(session_dir, LOGS_DIR)
    try:  # mkdir, not makedirs: a session directory removed meanwhile is not re-created
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    same_uid.ensure_private_dir(folder, create=False)
    return folder


class CappedLog:
    """One worker stream's log file. ``write`` appends; past ``cap`` bytes the file becomes
    ``<name>.1`` (replacing the older one) and a new one starts. Errors (a full disk, the
    session removed) turn the log off, never the output path."""

    __slots__ = ("path", "cap", "fd", "size")

    def __init__(self, path: str, cap: int):
        self.path = path
        self.cap = cap
        self.fd = os.open(path, _FLAGS, 0o600)
        self.size = os.fstat(self.fd).st_size

    def write(self, data: bytes) -> None:
        if self.fd < 0:
            return
        try:
            os.write(self.fd, data)
            self.size += len(data)
            if self.size >= self.cap:
                os.close(self.fd)
                self.fd = -1
                os.replace(self.path, self.path + ".1")
                self.fd = os.open(self.path, _FLAGS, 0o600)
                self.size = 0
        except OSError:
            self.close()

    def close(self) -> None:
        """Close the file; one that stayed empty is removed (most workers print nothing, and
        a node's session would otherwise gather two empty files per worker it ever ran)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
                if self.size == 0 and not os.path.exists(self.path + ".1"):
                    os.unlink(self.path)
            except OSError:
                pass
            self.fd = -1


class LogTee:
    """A remote driver's worker's stream, kept in its node's session (``CappedLog``) while
    the node relays it to the driver. ``write`` is called by the relay thread with each
    chunk it copies; ``open`` by the node's loop once the fork server named the pid (what
    came before waits in ``early``, at most EARLY_MAX bytes: the rest of it is in the
    driver's output only); ``close`` when the relay ends. Any order works: a tee closed
    before it was opened writes what came early and closes at once. A lock makes the two
    threads' calls atomic; it is only ever contended for the length of one file write.
    Errors (a full disk, the session removed) turn the file off, never the relay."""

    __slots__ = ("early", "log", "ended", "lock", "__weakref__")  # the node keeps a WeakSet

    EARLY_MAX = 65536

    def __init__(self) -> None:
        self.early: bytearray | None = bytearray()
        self.log: CappedLog | None = None
        self.ended = False
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.log is not None:
                self.log.write(data)
            elif self.early is not None and len(self.early) < self.EARLY_MAX:
                self.early += data[:self.EARLY_MAX - len(self.early)]

    def open(self, session_dir: str, pid: int, err: bool, cap: int) -> None:
        """Keep the stream as ``<session>/logs/worker-<pid>.out`` (``.err``) from now on."""
        with self.lock:
            early, self.early = self.early, None
            if early is None or cap <= 0 or not session_dir:
                return  # opened already, or no log files
            try:
                ensure_logs_dir(session_dir)
                log = CappedLog(log_path(session_dir, pid, err), cap)
            except (OSError, RuntimeError):  # RuntimeError: InsecurePathError
                return
            if early:
                log.write(bytes(early))
            if self.ended:
                log.close()
            else:
                self.log = log

    def close(self) -> None:
        with self.lock:
            self.ended = True
            if self.log is not None:
                self.log.close()
                self.log = None


def note_actor(session_dir: str, actor_id_hex: str, pid: int) -> None:
    """Record that ``pid`` hosts the actor (a restarted actor adds its new pid)."""
    if not session_dir:
        return
    try:
        ensure_logs_dir(session_dir)
        fd = os.open(os.path.join(session_dir, LOGS_DIR, f"actor-{actor_id_hex}"), _FLAGS,
                     0o600)
        try:
            os.write(fd, f"{pid}\n".encode())
        finally:
            os.close(fd)
    except (OSError, RuntimeError):  # RuntimeError: InsecurePathError
        pass  # no log index: `miniray logs --actor-id` says it found nothing


def _sessions(root: str) -> list[str]:
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if n.startswith("session_")]


def find_worker_logs(session_dirs: list[str], pid: int, err: bool) -> list[str]:
    """The log files of worker ``pid`` (the rotated generation first), in the first of
    ``session_dirs`` that has them; [] if none does."""
    for session_dir in session_dirs:
        path = log_path(session_dir, pid, err)
        found = [p for p in (path + ".1", path) if os.path.isfile(p)]
        if found:
            return found
    return []


def find_actor_pids(session_dirs: list[str], actor_id_hex: str) -> tuple[str, list[int]] | None:
    """The session and pids (oldest first) that hosted the actor, or None."""
    for session_dir in session_dirs:
        try:
            with open(os.path.join(session_dir, LOGS_DIR, f"actor-{actor_id_hex}")) as f:
                pids = [int(line) for line in f.read().split() if line.isdigit()]
        except OSError:
            continue
        return session_dir, pids
    return None


def session_dirs(root: str, extra: list[str] = ()) -> list[str]:
    """Where to look: ``extra`` (the nodes' sessions) first, then every session under
    ``root``."""
    out = [d for d in extra if d]
    out += [d for d in _sessions(root) if d not in out]
    return out


def read_text(paths: list[str], tail: int, last: bytes | None = None) -> str:
    """The files' text, markers turned into ``:task_name:<name>`` lines as in Ray's worker
    logs and progress-bar lines dropped; the last ``tail`` lines (-1 or less: all).
    ``last``: the last file's bytes, read already (``follow_step``)."""
    lines: list[str] = []
    carry = ""
    for index, path in enumerate(paths):
        if last is not None and index == len(paths) - 1:
            data = carry + last.decode("utf-8", "replace")
        else:
            try:
                with open(path, "rb") as f:
                    data = carry + f.read().decode("utf-8", "replace")
            except OSError:
                data = carry  # rotated away meanwhile
        carry = ""
        if path.endswith(".1") and paths[index + 1:index + 2] == [path[:-2]]:
            carry = data  # the file after it continues it: a rotation may split a line
            continue
        lines += _lines(data).splitlines()
    if tail >= 0:
        lines = lines[-tail:] if tail else []
    return "".join(line + "\n" for line in lines)


def _lines(data: str) -> str:
    out = []
    for whole in data.splitlines():
        # A task's last line without a newline runs into the next marker.
        for line in _MARKER_START.split(whole):
            marker = _TASK_MARKER.match(line)
            if marker:
                out.append(f":task_name:{marker.group(2)}")
            elif line and not line.startswith(_BAR_MARKER):
                out.append(line)
    return "".join(line + "\n" for line in out)


def find_named(session_dirs: list[str], name: str) -> list[str]:
    """The log files called ``name`` (``worker-<pid>.out``; ``worker-<pid>`` means its
    ``.out``; a glob such as ``worker-*.err`` as ``ray logs`` takes), each file's rotated
    generation before it, from the first session that has any. Nothing outside ``logs/``."""
    base = os.path.basename(name)
    if base != name or not base.startswith("worker-"):
        return []
    if not base.endswith((".out", ".err", "*")):
        base += ".out"
    for session_dir in session_dirs:
        folder = os.path.join(session_dir, LOGS_DIR)
        try:
            names = sorted(n for n in os.listdir(folder) if fnmatch.fnmatchcase(n, base)
                           and n.endswith((".out", ".err")))
        except OSError:
            continue
        found = []
        for n in names:
            path = os.path.join(folder, n)
            found += [p for p in (path + ".1", path) if os.path.isfile(p)]
        if found:
            return found
    return []


def listing(session_dirs: list[str]) -> str:
    """Every session's log files, a line each (``<size> <path>``), as ``ray logs`` lists."""
    out = []
    for session_dir in session_dirs:
        folder = os.path.join(session_dir, LOGS_DIR)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        out.append(f"{folder}:")
        for name in names:
            if name.startswith("worker-"):
                try:
                    size = os.stat(os.path.join(folder, name)).st_size
                except OSError:
                    continue
                out.append(f"  {size:>10}  {name}")
    return "".join(line + "\n" for line in out)


def read_from(path: str, offset: int, limit: int = -1,
              whole_lines: bool = True) -> tuple[str, int]:
    """What was appended to ``path`` since ``offset`` (from the start after a rotation), as
    text with markers handled, and the new offset: whole lines only, at most ``limit``
    bytes (-1: all; a line longer than ``limit`` comes in pieces, cut between characters);
    the rest next time. ``whole_lines`` False, for a file no longer written: its unended
    last line too."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < offset:
                offset = 0
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        return "", offset
    full = limit >= 0 and len(data) == limit
    end = len(data) if not whole_lines else data.rfind(b"\n") + 1  # else the rest next time
    if (end == 0 or not whole_lines) and full:
        end = _character_end(data)  # cut at the limit: between characters
    return _lines(data[:end].decode("utf-8", "replace")), offset + end


def _character_end(data: bytes) -> int:
    """How much of ``data`` ends on a whole UTF-8 character (all of it but an unended
    last character; all of it when that is its first byte, or the bytes are not UTF-8).

    >>> _character_end("ab\u00e9".encode()[:3]), _character_end(b"abc")
    (2, 3)
    """
    start = len(data) - 1
    while start > 0 and data[start] & 0xC0 == 0x80 and len(data) - start < 4:
        start -= 1  # back over continuation bytes to the character's first
    lead = data[start] if data else 0
    size = 2 if lead & 0xE0 == 0xC0 else 3 if lead & 0xF0 == 0xE0 else \
        4 if lead & 0xF8 == 0xF0 else 1
    return start if start > 0 and start + size > len(data) else len(data)


def follow_step(paths: list[str], tail: int, state: list | None) -> tuple[str, list]:
    """One step of following a log (``get_log(follow=True)``) whose files are ``paths``
    now (its rotated generation first; an actor's: its latest worker's last): the text
    and the state to pass to the next step, ``[file name, inode, offset]`` of the file
    read. ``state`` None: the last ``tail`` lines, the last file read once. Else what was
    written since, at most ``MAX_ANSWER_CHARS`` bytes a step, none lost or shown twice:
    the file followed rotated (its inode is now ``<name>.1``'s), first the rest of it,
    then the new file from its start; a new last file (the actor's next worker), the
    rest of the old one, then the new one from its start."""
    last = paths[-1]
    if state is None:
        try:
            with open(last, "rb") as f:
                inode, data = os.fstat(f.fileno()).st_ino, f.read()
        except OSError:
            inode, data = 0, b""
        end = data.rfind(b"\n") + 1
        return _last_chars(read_text(paths, tail, last=data[:end])), \
            [os.path.basename(last), inode, end]
    name, inode, offset = state
    folder = os.path.dirname(last)
    old = os.path.join(folder, name)
    for path in (old, old + ".1"):  # where the file followed is now, if still there
        found = _stat(path)
        if found is not None and found.st_ino == inode:
            text, at = read_from(path, offset, MAX_ANSWER_CHARS)
            if path == last or text:
                return text, [name, inode, at]
            if at < found.st_size:  # no longer written: its unended last line too
                text, at = read_from(path, at, MAX_ANSWER_CHARS, whole_lines=False)
                return text, [name, inode, at]
            break  # read to its end, and another file is written now
    found = _stat(last)
    return "", [os.path.basename(last), found.st_ino if found else 0, 0]  # the next step reads it


def follow(paths: Callable[[], list[str]], tail: int, interval: float) -> Iterator[str]:
    """Follow a log on this host (``miniray logs -f``, ``get_log(follow=True)``): yields
    ``follow_step``'s text, whenever there is some, every ``interval`` seconds, until the
    caller stops iterating; ``paths()`` finds its files again each step (an actor's next
    worker has files of its own; ValueError: none now, the last found stay)."""
    found, state = paths(), None
    while True:
        text, state = follow_step(found, tail, state)
        if text:
            yield text
        time.sleep(interval)
        try:
            found = paths()
        except ValueError:
            pass


def _last_chars(text: str) -> str:
    """``text``'s last MAX_ANSWER_CHARS characters at most, whole lines."""
    if len(text) > MAX_ANSWER_CHARS:
        text = text[-MAX_ANSWER_CHARS:]
        text = text[text.find("\n") + 1:]
    return text


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def names_by_kind(session_dirs: list[str], glob_filter: str | None = None) -> dict:
    """``list_logs``' answer: the workers' log file names of the sessions, by kind
    (``worker_out``, ``worker_err``), as Ray groups a node's files."""
    out: dict[str, list[str]] = {}
    for session_dir in session_dirs:
        try:
            names = sorted(os.listdir(os.path.join(session_dir, LOGS_DIR)))
        except OSError:
            continue
        for name in names:
            if not name.startswith("worker-") or not name.endswith((".out", ".err")):
                continue
            if glob_filter and not fnmatch.fnmatchcase(name, glob_filter):
                continue
            out.setdefault("worker_out" if name.endswith(".out") else "worker_err",
                           []).append(name)
    return out


def find_log(session_dirs: list[str], filename: str | None = None,
             actor_id: str | None = None, pid: int | None = None,
             err: bool = False) -> tuple[list[str], str]:
    """The files ``get_log`` reads for a file name, an actor or a worker pid (the first
    given), and how to name what was asked; ValueError if none is given."""
    if filename is not None:
        return find_named(session_dirs, filename), f"file {filename!r}"
    if actor_id is not None:
        found = find_actor_pids(session_dirs, str(actor_id).lower())
        return ([p for p_id in (found[1] if found else ())
                 for p in find_worker_logs([found[0]], p_id, err)], f"actor {actor_id}")
    if pid is not None:
        return find_worker_logs(session_dirs, int(pid), err), f"worker pid {pid}"
    raise ValueError("get_log needs one of filename, actor_id, task_id or pid.")


_HEX_RE = re.compile(r"[0-9a-f]{1,64}")


def _query_problem(query) -> str | None:
    if not isinstance(query, dict) or query.get("what") not in ("list", "get", "follow"):
        return "a logs query is a dict with 'what': 'list', 'get' or 'follow'"
    for name in ("glob", "filename", "actor_id"):
        value = query.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > 256):
            return f"a logs query's {name!r} is a str of at most 256 characters"
    for name in ("pid", "tail"):
        value = query.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"a logs query's {name!r} is an int"
    state = query.get("state")
    if state is not None and not (
            isinstance(state, list) and len(state) == 3 and isinstance(state[0], str)
            and len(state[0]) <= 256 and os.path.basename(state[0]) == state[0]
            and state[0].startswith("worker-") and state[0].endswith((".out", ".err"))
            and all(type(v) is int and v >= 0 for v in state[1:])):
        return "a logs query's 'state' is None or [file name, inode, offset]"
    if query.get("suffix", "out") not in ("out", "err"):
        return "a logs query's 'suffix' is 'out' or 'err'"
    if query["what"] != "list":  # one worker's files: read in full, on the node's loop
        filename = query.get("filename") or ""
        if any(c in filename for c in "*?["):
            return ("a logs query's 'filename' names one file (no '*', '?' or '['): "
                    "list_logs(glob_filter=...) finds the names")
        actor_id = query.get("actor_id")
        if actor_id is not None and not _HEX_RE.fullmatch(actor_id):
            return "a logs query's 'actor_id' is the actor's id in hex"
    return None


def answer_query(session_dir: str, query) -> tuple[str, object]:
    """What a node answers another host's ``list_logs``/``get_log`` about its own session
    (read-only: only ``<session>/logs/worker-*`` files are read): ``("logs", names by
    kind)`` for ``{"what": "list", "glob"}``, ``("logs", text)`` for ``{"what": "get",
    "filename" | "actor_id" | "pid", "suffix", "tail"}`` (its last MAX_ANSWER_CHARS
    characters at most, whole lines), ``("logs", [text, state])`` for ``{"what":
    "follow", ..., "state"}`` (``follow_step``), else ``(kind, text)``: "malformed" or
    "no_log".

    >>> answer_query("/nonexistent", {"what": "get", "pid": 1})[0]
    'no_log'
    >>> answer_query("/nonexistent", {"what": "rm"})[0]
    'malformed'
    """
    problem = _query_problem(query)
    if problem is not None:
        return "malformed", problem
    sessions = [session_dir] if session_dir else []
    if query["what"] == "list":
        names = names_by_kind(sessions, query.get("glob"))
        return "logs", {kind: found[:MAX_ANSWER_NAMES] for kind, found in names.items()}
    try:
        paths, what = find_log(sessions, query.get("filename"), query.get("actor_id"),
                               query.get("pid"), query.get("suffix") == "err")
    except ValueError as error:
        return "malformed", str(error)
    if not paths:
        return "no_log", (f"no log of {what} on this node: it printed nothing, its session "
                          "ended, or MINIRAY_WORKER_LOG_BYTES=0 there.")
    if query["what"] == "follow":
        return "logs", list(follow_step(paths, query.get("tail", 1000), query.get("state")))
    return "logs", _last_chars(read_text(paths, query.get("tail", 1000)))
