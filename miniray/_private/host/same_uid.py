"""Proof that a directory, a file or a socket peer belongs to this user, before it is trusted.

Owns: the checks miniray makes before it uses something another local user could have put in
its way: a directory it creates or reuses (``ensure_private_dir``), a file it is about to map
and unpickle (``check_owned_fd``), the process at the other end of an AF_UNIX socket
(``require_same_uid_peer``, ``accept_same_uid``), and the error they raise
(``InsecurePathError``). Does not own: what lives in those directories or travels on those
sockets (session.py, shm_segments.py, node.py, actor_link.py, ...).
Called by: every module that creates a directory, maps a segment or connects a socket.

Why: miniray unpickles what it reads from its session directory, its segments and its
sockets, and unpickling runs code. ``/dev/shm`` and ``/tmp`` are writable by every user, so a
second user could pre-create ``/dev/shm/miniray-<uid>`` with mode 0777 (or as a symlink to
their own directory) and later swap the files in it, or listen on the socket path first. So:

* a directory is used only if ``lstat`` shows a real directory (never a symlink), owned by
  this uid, with no group or other permission bit. It is created with ``mkdir`` and then
  checked, so a race with another user's ``mkdir`` ends in a refusal, never in trust;
* a file is unpickled only if the descriptor it was opened on (``O_NOFOLLOW``) is a regular
  file owned by this uid (``fstat``, not the name: a name can change between two calls);
* a socket is read only once ``SO_PEERCRED`` says the peer runs as this uid.

Root bypasses every permission, and a process of the same uid is trusted: neither is a
boundary miniray can draw. Ray 2.60 defines no exception for these refusals;
``InsecurePathError`` is miniray's own (a RuntimeError).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Iterator  # not typing: importing typing costs milliseconds

__all__ = [
    "InsecurePathError", "accept_same_uid", "check_owned_fd", "dir_problem",
    "ensure_private_dir", "owner_name", "peer_creds", "require_same_uid_peer",
]  # fmt: skip

DEFAULT_REMEDY = "set MINIRAY_TMPDIR to a private directory of your own"


class InsecurePathError(RuntimeError):
    """A directory, file or socket miniray would use is not provably this user's own.

    The message names the path, its owner (user name and uid) and mode, and what to do.
    """


def owner_name(uid: int) -> str:
    """``"name (uid N)"``, or ``"uid N"`` when the uid has no passwd entry."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def dir_problem(st: os.stat_result, uid: int) -> str | None:
    """Pure: what is wrong with a directory whose ``lstat`` is ``st`` for user ``uid``, or None.

    Checked in this order: a symlink, not a directory, another owner, group/other bits.
    """
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"belongs to {owner_name(st.st_uid)}, not to {owner_name(uid)}"
    if stat.S_IMODE(mode) & 0o077:
        return f"has mode {stat.S_IMODE(mode):04o}: other users may write or read it"
    return None


def _refusal(path: str, problem: str, st: os.stat_result | None, remedy: str) -> str:
    facts = ""
    if st is not None:
        facts = f" (owner {owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"
    return (f"miniray refuses to use {path}{facts}: it {problem}. Another local user could "
            f"place code there that miniray would run as you. Remove it, or {remedy}.")


def ensure_private_dir(path: str, *, top: str | None = None, remedy: str = DEFAULT_REMEDY,
                       create: bool = True) -> str:
    """Create or check ``path``, and each directory between ``top`` and it, as private dirs.

    Each one is made with ``mkdir(0o700)`` if missing, then checked with ``lstat``
    (``dir_problem``); InsecurePathError names the first one that fails. Directories above
    ``top`` (default: ``path`` itself) are created if missing (like ``makedirs``) but not
    checked: they are the user's choice (``MINIRAY_TMPDIR``) or system ones (``/dev/shm``).
    With ``create=False`` nothing is created: a missing directory is fine (nothing in it can
    be read), an existing one is checked. Returns ``path``, absolute.

    Example:
        >>> ensure_private_dir("/dev/shm/miniray-1000")  # doctest: +SKIP
        '/dev/shm/miniray-1000'
    """
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top else path
    if path != top and not path.startswith(top.rstrip(os.sep) + os.sep):
        raise ValueError(f"miniray bug: {path} is not inside {top}")
    parent = os.path.dirname(top)
    if create and parent and not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    chain = [top]
    rest = os.path.relpath(path, top)
    if rest != ".":
        for part in rest.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
    uid = os.getuid()
    for directory in chain:
        try:
            if create:
                os.mkdir(directory, 0o700)
            elif not os.path.lexists(directory):
                return path
        except FileExistsError:
            pass
        except PermissionError as error:  # e.g. inside another user's directory
            st = _lstat_or_none(directory)
            problem = dir_problem(st, uid) if st is not None else None
            raise InsecurePathError(_refusal(
                directory, problem or f"cannot be created ({error.strerror})", st, remedy
            )) from None
        try:
            st = os.lstat(directory)
        except OSError as error:  # removed between mkdir and lstat, or not ours to look into
            raise InsecurePathError(_refusal(
                directory, f"cannot be examined ({error.strerror})", None, remedy)) from None
        problem = dir_problem(st, uid)
        if problem:
            raise InsecurePathError(_refusal(directory, problem, st, remedy))
    return path


def _lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def check_owned_fd(fd: int, path: str) -> os.stat_result:
    """The ``fstat`` of ``fd`` (opened on ``path``) if it is a regular file of this uid;
    else InsecurePathError. Call it before reading anything that will be unpickled."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InsecurePathError(_refusal(path, "is not a regular file", st,
                                         "remove it"))
    if st.st_uid != os.getuid():
        raise InsecurePathError(_refusal(
            path, f"belongs to {owner_name(st.st_uid)}, not to {owner_name(os.getuid())}",
            st, "remove it (as its owner or root)"))
    return st


def peer_creds(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a connected AF_UNIX socket."""
    pid, uid, _gid = struct.unpack(
        "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def require_same_uid_peer(sock: socket.socket, path: str) -> int:
    """The peer's pid if it runs as this uid; else ConnectionRefusedError (nothing was read)."""
    pid, uid = peer_creds(sock)
    if uid != os.getuid():
        raise ConnectionRefusedError(
            f"the process listening on {path} (pid {pid}) runs as {owner_name(uid)}, not as "
            f"{owner_name(os.getuid())}; miniray refuses to talk to it. Remove {path} and "
            "restart the node (`miniray stop`, `miniray start --head`).")
    return pid


def accept_same_uid(listener: socket.socket, log) -> Iterator[tuple[socket.socket, int]]:
    """``(socket, peer pid)`` for each connection waiting on the non-blocking ``listener``
    whose peer runs as this uid; others are closed unread (and logged)."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            log.warning("accept failed: %s", error)
            return
        try:
            peer_pid, uid = peer_creds(conn)
        except OSError:
            conn.close()
            continue
        if uid != os.getuid():
            log.warning("refused a connection from pid %d of %s", peer_pid, owner_name(uid))
            conn.close()
            continue
        yield conn, peer_pid
