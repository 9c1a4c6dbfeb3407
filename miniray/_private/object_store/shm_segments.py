"""Object segments as files: names, creating, attaching, sweeping. Any process.

Owns: the naming of segment files, writing a new segment (a worker's result, or the owner's
put), attaching to one read-only (zero-copy loads), checking whether anyone still maps a
segment, and sweeping the segments of dead sessions. Does not own: the table of objects,
capacity, spilling or recycling decisions (``shm_store.py``), or the byte layout (``oob.py``).
Called by: shm_store.py (the owner), workers (``create_segment``, ``read_segment``,
``read_spilled``), and whoever sweeps dead sessions (``sweep_segments``).

Lifetime rules:

1. Segment names are ``mr_<session tag>_<rest>``; the tag (8-24 letters or digits, no ``_``)
   is unique per session, so everything of a session can be found by name. A tag
   ``new_session_tag`` made says the owner's PID namespace and pid (``session_tag_owner``),
   so a sweeper deletes only segments whose owner is provably dead in its own namespace.
2. Only the owner unlinks. A worker creates a segment for a result, hands ``(path, size)`` to
   the owner and forgets it; it unlinks nothing, except a stale segment of the same object
   left by an earlier attempt of the same task that crashed before its hand-over.
3. Readers only attach: ``open(O_NOFOLLOW)`` + ``fstat`` (a regular file of this uid:
   ``/dev/shm`` is writable by every user, and the bytes are unpickled) + ``flock(LOCK_SH)``
   + ``mmap`` + ``close``. No resource
   tracker is involved anywhere (``multiprocessing.shared_memory`` is not used: before 3.13
   its tracker unlinks segments behind the owner, gh-82300). A mapping stays readable after
   the file is unlinked and is released when the last array viewing it is garbage.
4. The shared lock lives as long as the mapping (the mapping holds the open file), so before
   recycling a freed segment the owner renames it (no new reader can open it) and tries
   ``flock(LOCK_EX | LOCK_NB)``: while any process still maps it, it is never reused (it
   waits in the pool as draining, and is unlinked if nobody lets go before it expires).
5. Pinned objects (being read) are never spilled, restored, recycled or unlinked; ``free`` of
   a pinned object takes effect at the last ``unpin``.
6. ``close()`` (or the store being garbage, or interpreter exit, in the creating process only)
   unlinks every segment and spill file carrying the session tag, orphans of crashed workers
   included. A session killed with SIGKILL leaves its segments to ``sweep_segments``.

Segments are plain files created with ``os.open(O_CREAT | O_EXCL)`` in the shared-memory
directory (``MINIRAY_SHM_DIR``, default ``/dev/shm``; or the store's fallback directory) and
mapped with ``mmap``; nothing here registers with ``multiprocessing``'s resource tracker.
A new segment's bytes go in with one ``pwritev``, or, when it is large and the CPUs allow, on
several threads through a mapping (``parallel_write``); either way ENOSPC is an OSError and
the file is unlinked.

The shared-memory directory (``prepare_shm_dir``): ``/dev/shm`` is used as it is. Any other
(``MINIRAY_SHM_DIR``; two fake hosts on one machine each get their own) is created with mode
0700 when missing, then refused (``InsecurePathError``, naming it and what to do) when it is a
symlink or not a directory, belongs to another user (except root's sticky directories, as
``/dev/shm`` itself), or is group- or world-writable without the sticky bit; and refused
(``ValueError``) when a file in it cannot be created and mapped shared. A directory that is
not memory-backed is accepted with a warning (segments then live in the page cache).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import mmap
import os
import re
import stat
import sys
import time
from typing import Any, Callable

from miniray._private.core import oob
from miniray._private.host import lock_probe, procinfo, same_uid, shm_mounts
from miniray._private.object_store import parallel_write, store_policy
from miniray.exceptions import ObjectStoreFullError, OutOfDiskError

__all__ = [
    "DEFAULT_INLINE_THRESHOLD", "DEFAULT_SHM_DIR", "SEGMENT_PREFIX", "create_segment",
    "new_session_tag", "read_segment", "read_spilled", "segment_name", "session_tag_owner",
    "session_tag_pid", "sweep_dead_segments", "sweep_segments", "write_segment",
    # for shm_store.py
    "Pooled", "SegmentPool", "check_adoptable", "check_tag", "copy_file", "discard",
    "free_bytes", "load_mapping", "map_readonly", "mib", "no_room_error", "resolve_path",
    "retire_for_reuse", "same_filesystem", "shm_dir_problem", "spill_copy", "sweep_tag",
    "prepare_shm_dir", "shm_dir_refusal",
    "tag_of", "unlink_quiet", "write_through_mapping",
]  # fmt: skip

logger = logging.getLogger(__name__)

# Values whose serialized size (header, metadata and buffers) is below this travel inline,
# as pickled bytes in the owner's memory and inside task messages; larger ones get a segment.
# Measured here (benchmarks/bench_store.py, "threshold_sweep", median of 200): an inline trip
# (pickle, socketpair send + recv, unpickle) costs 37 us at 64 KiB and 46 us at 128 KiB; a
# segment trip (create, pwritev, attach, load, unlink) 97 and 131 us. From 192 KiB on, inline
# jumps (277 us at 192 KiB, 382 at 256: large buffers land in fresh mmap'd pages) and the
# segment wins (160, 190 us). The crossover lies between 128 and 192 KiB; Ray's 100 KiB stays
# on the cheap side of it for every size, bounds what inline objects add to the owner's
# uncapped heap and to every task message, and keeps Ray's rule for which values come back
# as zero-copy views.
DEFAULT_INLINE_THRESHOLD = 100 * 1024
DEFAULT_SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "mr_"
_TAG_RE = re.compile(r"[A-Za-z0-9]{8,24}\Z")
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000)  # Linux's value; the name is 3.10+
# Before 3.13 every mmap object keeps a duplicate of its file descriptor; 3.13 can do without
# (the mapping itself keeps the open file, and so the flock, alive).
_MMAP_KW = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# --- names ------------------------------------------------------------------------------------


def segment_name(session_tag: str, object_id: bytes) -> str:
    """``mr_<tag>_<object id hex>``; the full id (56 hex digits), so no two objects collide."""
    return f"{SEGMENT_PREFIX}{session_tag}_{object_id.hex()}"


def new_session_tag(pid: int | None = None, root: str | None = None) -> str:
    """A fresh session tag: the owner's PID namespace (``procinfo.ns_tag``, 8 hex digits), its
    pid (8 hex digits) and random hex digits, after the 6-hex tag of the session root when
    ``root`` is given (``session.root_tag``), so a test harness or CI job that set
    MINIRAY_TMPDIR can tell its own segments (``mr_<root>...``).

    With the namespace and pid in the tag, a sweeper can tell a dead session from its tag
    alone (``session_tag_owner``): a reused pid only delays the sweep, and a session of
    another PID namespace (a container sharing ``/dev/shm``) is never judged from here.
    """
    pid_hex = f"{(os.getpid() if pid is None else pid) & 0xFFFFFFFF:08x}"
    ns = procinfo.ns_tag()
    if root:
        return f"{root[:6]}{ns}{pid_hex}{os.urandom(1).hex()}"
    return f"{ns}{pid_hex}{os.urandom(2).hex()}"


def session_tag_owner(tag: str) -> tuple[str, int] | None:
    """``(ns tag, pid)`` that ``new_session_tag`` put in ``tag``, or None for a tag it did not
    make (older tags without a namespace included: nobody can prove their owner dead)."""
    if len(tag) == 20:
        ns, digits = tag[:8], tag[8:16]
    elif len(tag) == 24:
        ns, digits = tag[6:14], tag[14:22]
    else:
        return None
    try:
        int(ns, 16)
        return ns, int(digits, 16)
    except ValueError:
        return None


def session_tag_pid(tag: str) -> int | None:
    """The pid ``new_session_tag`` put in ``tag``, or None for a tag it did not make."""
    owner = session_tag_owner(tag)
    return None if owner is None else owner[1]


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ValueError(f"session_tag must be 8-16 ASCII letters or digits, got {tag!r}")
    return tag


def tag_of(name: str) -> str | None:
    if not name.startswith(SEGMENT_PREFIX):
        return None
    tag, sep, _rest = name[len(SEGMENT_PREFIX) :].partition("_")
    return tag if sep and _TAG_RE.match(tag) else None


def resolve_path(name: str, shm_dir: str) -> str:
    return name if os.sep in name else os.path.join(shm_dir, name)


def check_adoptable(name: str, size: int, shm_dir: str, session_tag: str) -> tuple[str, int]:
    """``(path, file size)`` of a segment a worker announced; ValueError if it is not one of
    the session's, FileNotFoundError if it does not exist, InsecurePathError if it is not a
    regular file of this uid (the owner would map and unpickle it, and later unlink it)."""
    path = resolve_path(name, shm_dir)
    if tag_of(os.path.basename(path)) != session_tag or os.path.dirname(path) != shm_dir:
        raise ValueError(f"{name!r} is not a segment of session {session_tag} in {shm_dir}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        actual = same_uid.check_owned_fd(fd, path).st_size
    finally:
        os.close(fd)
    if actual < size:
        raise ValueError(f"segment {path} holds {actual} bytes, {size} were announced")
    return path, actual


def unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:  # never let cleanup mask what the caller is doing
        logger.debug("could not unlink %s: %s", path, error)


# --- segments: any process ---------------------------------------------------------------------


def write_segment(path: str, ser: oob.Serialized) -> int:
    """Create ``path`` (which must not exist) holding ``ser``; returns its size.

    Written with one ``pwritev`` (``oob.Serialized.write_fd``), or, for a segment of tens of
    MiB on a memory filesystem with CPUs to spare, on several threads through a mapping after
    ``posix_fallocate`` (``parallel_write``: its ``write_plan`` decides). A partly written file
    is unlinked before the error propagates (ENOSPC: an OSError, from either way).
    """
    threads = parallel_write.plan_for(os.path.dirname(path), ser.total_size)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        if threads:
            parallel_write.write_threaded(fd, ser.pieces(), ser.total_size, threads)
        else:
            ser.write_fd(fd)
    except BaseException:
        unlink_quiet(path)
        raise
    finally:
        os.close(fd)
    return ser.total_size


def create_segment(
    session_tag: str,
    object_id: bytes,
    value: Any,
    *,
    shm_dir: str = DEFAULT_SHM_DIR,
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
) -> tuple[str, int] | None:
    """Write a large value (a worker's task result) into a new segment of the session.

    Returns ``(path, size)`` to send to the owner, who adopts the segment with
    ``put_segment_from``; or None when the value is below ``inline_threshold`` (send it
    inline). ``value`` may already be ``oob.serialize(result)``: a worker that serializes
    first sends ``ser.inband()`` for small results and passes ``ser`` here for large ones,
    so nothing is pickled twice. Raises ObjectStoreFullError when ``shm_dir`` is full.
    """
    ser = value if isinstance(value, oob.Serialized) else oob.serialize(value)
    if ser.total_size < inline_threshold:
        return None
    path = os.path.join(shm_dir, segment_name(check_tag(session_tag), object_id))
    for attempt in (1, 2):
        try:
            return path, write_segment(path, ser)
        except FileExistsError:
            if attempt == 2:
                raise
            # Only an earlier attempt of the same task, dead before handing the segment
            # over, can have left this name: the owner never adopted it.
            logger.debug("replacing stale segment %s of a crashed earlier attempt", path)
            unlink_quiet(path)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.ENOMEM):
                raise
            raise no_room_error(shm_dir, ser.total_size, object_id) from error
    raise AssertionError("unreachable")  # pragma: no cover


def map_readonly(path: str) -> mmap.mmap:
    """Attach: a read-only mapping of the whole file, holding a shared flock (rule 4).

    InsecurePathError if the file is not a regular file of this uid (rule 3): its bytes are
    about to be unpickled."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = same_uid.check_owned_fd(fd, path)
        fcntl.flock(fd, fcntl.LOCK_SH)
        # The owner renames a freed segment before checking for readers: a reader that opened
        # the old name just before the rename must not map what is about to be reused.
        if os.stat(path).st_ino != st.st_ino:
            raise FileNotFoundError(errno.ENOENT, "segment was freed while attaching", path)
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ, **_MMAP_KW)
    finally:
        os.close(fd)  # the mapping keeps the open file, and with it the lock


def load_mapping(mapping: mmap.mmap, path: str) -> Any:
    # Never close the mapping: arrays view it; it goes when the last of them is garbage.
    return oob.load_segment(memoryview(mapping), path)


def read_segment(name: str, *, shm_dir: str = DEFAULT_SHM_DIR) -> Any:
    """The value in segment ``name`` (a bare name under ``shm_dir``, or a path).

    Arrays come back as read-only views of the segment. Raises FileNotFoundError if the
    segment is gone (freed, or spilled while not pinned: ask the owner again).
    """
    path = resolve_path(name, shm_dir)
    return load_mapping(map_readonly(path), path)


def read_spilled(path: str) -> Any:
    """The value in a spill file: mapped read-only too, so still no copy in this process."""
    return load_mapping(map_readonly(path), path)


def sweep_segments(shm_dir: str, is_dead_tag: Callable[[str], bool]) -> list[str]:
    """Unlink every ``mr_<tag>_*`` in ``shm_dir`` whose tag ``is_dead_tag`` calls dead.

    ``is_dead_tag`` is consulted after the directory has been listed, once per tag, so a
    session that records its tag before creating its first segment is never swept.
    Returns the names unlinked.
    """
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    verdicts: dict[str, bool] = {}
    swept = []
    uid = os.getuid()
    for name in names:
        tag = tag_of(name)
        if tag is None:
            continue
        if tag not in verdicts:
            verdicts[tag] = bool(is_dead_tag(tag))
        if verdicts[tag]:
            path = os.path.join(shm_dir, name)
            try:  # another user's file is theirs to remove, even where root could
                if os.lstat(path).st_uid != uid:
                    continue
            except OSError:
                continue
            unlink_quiet(path)
            swept.append(name)
    if swept:
        logger.debug("swept %d segments of dead sessions from %s", len(swept), shm_dir)
    return swept


def tag_verdict(tag: str, here: procinfo.Identity | None = None, alive=None) -> str:
    """``"dead"`` (its owner is provably dead), ``"foreign"`` (another PID namespace, or a
    tag that does not say: left alone) or ``"alive"``. Pure given ``here`` and ``alive``."""
    owner = session_tag_owner(tag)
    if owner is None:
        return "foreign"
    here = here or procinfo.identity()
    ns, pid = owner
    if procinfo.is_provably_dead(pid, None, ns, "", here, alive):
        return "dead"
    return "alive" if ns == procinfo.ns_tag(here.pid_ns) else "foreign"


def sweep_dead_segments(shm_dir: str = DEFAULT_SHM_DIR) -> list[str]:
    """Unlink this uid's segments whose owner is provably dead (``tag_verdict``)."""
    here = procinfo.identity()
    return sweep_segments(shm_dir, lambda tag: tag_verdict(tag, here) == "dead")


def foreign_segment_count(shm_dir: str = DEFAULT_SHM_DIR, prefix: str = SEGMENT_PREFIX) -> int:
    """How many segments named ``<prefix>...`` belong to another PID namespace."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    here = procinfo.identity()
    verdicts: dict[str, str] = {}
    count = 0
    for name in names:
        tag = tag_of(name) if name.startswith(prefix) else None
        if tag is None:
            continue
        if tag not in verdicts:
            verdicts[tag] = tag_verdict(tag, here)
        count += verdicts[tag] == "foreign" and session_tag_owner(tag) is not None
    return count


def sweep_tag(tag: str, dirs: tuple[str, ...], owner_pid: int) -> None:
    """Finalizer: unlink everything named for ``tag``, in the process that created it only."""
    if os.getpid() != owner_pid:
        return  # a forked child never cleans up its parent's store
    for directory in dirs:
        sweep_segments(directory, lambda t: t == tag)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def mapped_elsewhere(path: str) -> bool:
    """Whether any process (this one included) holds a reader's mapping of ``path``; a
    segment that cannot be opened counts as mapped (nothing proves it free)."""
    return not lock_probe.lock_free(path)


def copy_file(src: str, dst: str, size: int) -> None:
    """Copy ``size`` bytes from ``src`` into a new file ``dst`` in the kernel (sendfile)."""
    src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        same_uid.check_owned_fd(src_fd, src)  # a spill file restored here is unpickled later
        dst_fd = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            done = 0
            while done < size:
                sent = os.sendfile(dst_fd, src_fd, done, size - done)
                if sent == 0:
                    raise OSError(errno.EIO, f"{src} ended after {done} of {size} bytes")
                done += sent
        except BaseException:
            unlink_quiet(dst)
            raise
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def shm_dir_problem(path: str, need: int) -> str | None:
    """Why ``path`` cannot hold segments (missing, read-only, under ``need`` bytes free)."""
    if not os.path.isdir(path):
        return f"{path} does not exist"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable"
    free = free_bytes(path)
    if free < need:
        return f"{path} has only {mib(free)} free (at least {mib(need)} needed)"
    return None


def shm_dir_refusal(st: os.stat_result, uid: int) -> str | None:
    """Pure: why a configured shared-memory directory whose ``lstat`` is ``st`` may not hold
    segments of user ``uid`` (they are unpickled, so nobody else may place files there), or
    None. Root's sticky directories (``/dev/shm``, ``/tmp`` themselves) are allowed: the
    sticky bit keeps other users from replacing our files."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    sticky = bool(mode & stat.S_ISVTX)
    if st.st_uid != uid and not (st.st_uid == 0 and sticky):
        return f"belongs to {same_uid.owner_name(st.st_uid)}, not to {same_uid.owner_name(uid)}"
    if stat.S_IMODE(mode) & 0o022 and not sticky:
        return (f"has mode {stat.S_IMODE(mode):04o}: group- or world-writable without the "
                "sticky bit, so another user could replace its files")
    return None


def _probe_mmap(path: str) -> None:
    """Create, map shared and unlink a one-page file in ``path``; raise ValueError if not."""
    probe = os.path.join(path, f".mr_probe_{os.getpid()}_{os.urandom(4).hex()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise ValueError(f"MINIRAY_SHM_DIR={path}: cannot create a file there "
                         f"({error.strerror}). Point it at a directory of yours on a "
                         "memory-backed filesystem (e.g. under /dev/shm).") from None
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
        mmap.mmap(fd, mmap.PAGESIZE, flags=mmap.MAP_SHARED).close()
    except OSError as error:
        raise ValueError(f"MINIRAY_SHM_DIR={path}: files there cannot be mapped shared "
                         f"({error.strerror}). Point it at a directory on a memory-backed "
                         "filesystem (e.g. under /dev/shm).") from None
    finally:
        os.close(fd)
        unlink_quiet(probe)


def prepare_shm_dir(path: str) -> str:
    """The shared-memory directory ``path``, made ready for segments (see the module
    docstring); returns it absolute. ``/dev/shm`` itself is returned unchecked: the store
    falls back to files of its own when it is missing or small (``shm_dir_problem``)."""
    if not os.path.isabs(path):
        raise ValueError(f"MINIRAY_SHM_DIR must be an absolute path, got {path!r}: the "
                         "processes of a session (a node daemon starts in /) would each read "
                         "it against their own working directory.")
    path = os.path.normpath(path)
    if path == DEFAULT_SHM_DIR:
        _warn_huge_always(path, shm_mounts.describe(path)[1])
        return path
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        st = os.lstat(path)
    except OSError as error:
        raise ValueError(f"MINIRAY_SHM_DIR={path}: {error.strerror}.") from None
    problem = shm_dir_refusal(st, os.getuid())
    if problem is not None:
        raise same_uid.InsecurePathError(
            f"miniray refuses to use MINIRAY_SHM_DIR={path}: it {problem}. Shared-memory "
            "objects are unpickled, so nobody else may place files there. Point "
            "MINIRAY_SHM_DIR at a directory of your own (mode 0700, e.g. /dev/shm/<name>; "
            "miniray creates it if missing), or unset it to use /dev/shm.")
    _probe_mmap(path)
    backed, huge = shm_mounts.describe(path)
    if backed is False:
        logger.warning("MINIRAY_SHM_DIR=%s is not on a memory-backed filesystem: large "
                       "objects go through the page cache and may be written to disk.", path)
    _warn_huge_always(path, huge)
    return path


def _warn_huge_always(path: str, huge: str | None) -> None:
    """Warn when ``path``'s tmpfs gives every file a huge page (``huge``: its mode is
    ``huge=always``): each object, however small, then takes 2 MiB of memory."""
    if huge == "always":
        logger.warning("The shared-memory directory %s is on a tmpfs mounted with huge=always: "
                       "every object there, however small, takes a 2 MiB page. Mount it with "
                       "huge=within_size instead (huge pages for objects of 2 MiB and more "
                       "only).", path)


def write_through_mapping(
    path: str, size: int, mapping: mmap.mmap | None, ser: oob.Serialized
) -> mmap.mmap:
    """Write ``ser`` into an existing segment of ``size`` bytes through a writable mapping.

    Used for recycled segments, whose pages are already allocated (no SIGBUS on a full
    tmpfs). Their mapping is kept between uses: writing into pages this process already
    maps is a plain memcpy, several times faster than faulting in fresh tmpfs pages. A
    segment without one is mapped with MAP_POPULATE (one batched fault pass). Returns it.
    """
    if mapping is None:
        mapping = writable_mapping(path, size)
    with memoryview(mapping) as view:
        ser.write_into(view)
    return mapping


def writable_mapping(path: str, size: int) -> mmap.mmap:
    """A writable shared mapping of the existing segment ``path`` (``size`` bytes), its pages
    mapped in one batched pass (MAP_POPULATE) rather than one fault each."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, **_MMAP_KW)
    finally:
        os.close(fd)


def retire_for_reuse(path: str, pool_path: str) -> bool | None:
    """Owner only: rename a freed segment to ``pool_path`` and say whether it can be reused.

    After the rename no reader can attach by name; then any reader that still maps it holds
    a shared flock. True: nobody maps it. False: a reader still maps it (a worker that read
    it as a task's argument keeps its mapping until the owner's UNMAP arrives): it may be
    reused once ``mapped_elsewhere`` says nobody does. None: the rename failed and the
    segment was unlinked.
    """
    try:
        os.rename(path, pool_path)
    except OSError:
        unlink_quiet(path)
        return None
    return not mapped_elsewhere(pool_path)


def no_room_error(shm_dir: str, size: int, object_id: bytes) -> ObjectStoreFullError:
    """The error for a write that ``shm_dir`` itself had no room for (ENOSPC)."""
    return ObjectStoreFullError(
        f"No room in {shm_dir} for object {object_id.hex()} of {mib(size)} (only "
        f"{mib(free_bytes(shm_dir))} free): {shm_dir} is smaller than the object store "
        "capacity. Lower object_store_memory, or give the machine or container a larger "
        "/dev/shm (docker run --shm-size=...)."
    )


def spill_copy(path: str, spill_dir: str, size: int, label: str,
               spill_top: str | None = None) -> str:
    """Owner only: copy a segment into ``spill_dir`` (same name); returns the spill file.

    ``spill_dir`` and each directory from ``spill_top`` down to it are created or checked as
    private directories (``same_uid.ensure_private_dir``). A full disk raises OutOfDiskError;
    the segment itself is left alone either way.
    """
    target = os.path.join(spill_dir, os.path.basename(path))
    try:
        same_uid.ensure_private_dir(spill_dir, top=spill_top,
                                    remedy="set TMPDIR to a private directory of your own")
        copy_file(path, target, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutOfDiskError(
                f"Spilling object {label} ({mib(size)}) to {spill_dir} failed: "
                f"{error.strerror}. Free disk space there or drop ObjectRefs you no longer need."
            ) from error
        raise
    return target


def same_filesystem(path: str, other: str) -> bool:
    """Whether ``path`` (or its nearest existing parent) lies on ``other``'s filesystem."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return os.stat(path).st_dev == os.stat(other).st_dev
    except OSError:
        return False


class Pooled:
    """A freed segment kept for reuse, with the owner's writable mapping of it (or None).
    ``draining``: a reader still mapped it when it was freed; it is not reused until
    ``mapped_elsewhere`` says nobody does (``SegmentPool.drained``)."""

    __slots__ = ("path", "size", "mapping", "since", "draining", "waited")

    def __init__(self, path: str, size: int, mapping: mmap.mmap | None,
                 draining: bool = False):
        self.path, self.size, self.mapping = path, size, mapping
        self.since = time.monotonic()
        self.draining = draining
        self.waited = False  # a put already waited for it to drain


class SegmentPool:
    """The owner's recycled segments, oldest first. Not thread-safe: the store's lock
    guards every call; unlinking what it hands back (``discard``) happens outside it."""

    def __init__(self, shm_dir: str, session_tag: str):
        self._prefix = os.path.join(shm_dir, f"{SEGMENT_PREFIX}{session_tag}_pool")
        self._items: list[Pooled] = []
        self._names = itertools.count(1)  # next() is atomic: new_path needs no lock
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def new_path(self) -> str:
        return f"{self._prefix}{next(self._names)}"

    def sizes(self) -> list[tuple[int, int]]:
        return [(i, p.size) for i, p in enumerate(self._items)]

    def add(self, pooled: Pooled) -> None:
        self._items.append(pooled)
        self.bytes += pooled.size

    def draining(self) -> list[Pooled]:
        """The segments still mapped by a reader when last checked (a snapshot: check them
        with ``mapped_elsewhere`` outside the store's lock, then call ``drained``)."""
        return [p for p in self._items if p.draining]

    def drained(self, free: list[Pooled]) -> None:
        """These segments (from ``draining``) are no longer mapped: reusable from now on."""
        for pooled in free:
            pooled.draining = False

    def has_reusable(self, size: int) -> bool:
        """Whether ``take(size)`` would find a segment."""
        return store_policy.pick_reusable(
            size, [(p, p.size) for p in self._items if not p.draining]) is not None

    def take(self, size: int) -> Pooled | None:
        """The best reusable pooled segment for an object of ``size`` bytes, removed; or
        None."""
        best = store_policy.pick_reusable(
            size, [(p, p.size) for p in self._items if not p.draining])
        if best is not None:
            self.remove([self._items.index(best)])
        return best

    def remove(self, indices: list[int]) -> list[Pooled]:
        taken = [self._items[i] for i in indices]
        for i in sorted(indices, reverse=True):
            del self._items[i]
        self.bytes -= sum(p.size for p in taken)
        return taken

    def take_idle(self, max_idle_s: float) -> list[Pooled]:
        now = time.monotonic()
        return self.remove([i for i, p in enumerate(self._items) if now - p.since >= max_idle_s])


def discard(pooled: list[Pooled]) -> int:
    """Unlink pooled segments (outside the store's lock); returns the bytes given back."""
    for item in pooled:
        item.mapping = None
        unlink_quiet(item.path)
    return sum(item.size for item in pooled)
