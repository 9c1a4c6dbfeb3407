"""What the filesystem under a shared-memory directory offers: memory or disk, huge pages.

Owns: finding the mount a path lies on in ``/proc/self/mountinfo`` (``mount_of``, pure on the
text) and the two answers the store acts on: ``memory_backed`` (tmpfs, ramfs, hugetlbfs: a
segment there costs no disk I/O) and ``huge_pages`` (a tmpfs's ``huge=`` mode, as the
kernel's ``shmem_enabled`` ``deny``/``force`` override it). Does not own: checking or
creating the directory (``object_store/shm_segments.prepare_shm_dir``, which warns on what
these say) nor choosing it (``core/config.shm_dir``). Called by: ``prepare_shm_dir``
(``describe``: both answers from one read of the mounts).

Why huge pages matter: a new segment's first write pays one page allocation per 4 KiB page,
and each process that maps it one fault per 4 KiB page; on a tmpfs mounted with
``huge=within_size`` the kernel gives files that large 2 MiB pages: reading a new 200 MB
object costs a twentieth, and its first write runs near memcpy speed where the host backs
fresh 2 MiB pages at once (not on a VM that hands free ones back to its hypervisor:
``benchmarks/bench_huge_pages.py``, README "Large objects in huge pages"). ``huge=always``
gives every file, even a 100-byte object's, a 2 MiB page; ``within_size`` only files at
least that large. ``/dev/shm`` is mounted without ``huge=`` by most systems, and
``shmem_enabled`` does not govern tmpfs mounts (only ``deny`` and ``force`` do), so the
mount option is what counts.

Example:
    >>> line = "25 22 0:23 / /mnt/shm rw - tmpfs tmpfs rw,size=1g,huge=within_size"
    >>> mount_of("/mnt/shm/x", line)
    ('/mnt/shm', 'tmpfs', 'rw,size=1g,huge=within_size')
"""

from __future__ import annotations

import os

__all__ = ["MEMORY_FILESYSTEMS", "describe", "huge_pages", "huge_pages_of", "memory_backed",
           "mount_of"]

# Filesystems whose files are memory: a segment there costs no disk I/O.
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "hugetlbfs")

_MOUNTINFO = "/proc/self/mountinfo"
_SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def mount_of(path: str, mountinfo: str) -> tuple[str, str, str] | None:
    """Pure: the mount that ``path`` (absolute, symlinks resolved) lies on, from the text of a
    ``mountinfo`` file: ``(mount point, filesystem type, super options)`` of the longest
    mount point above it (the last listed of equal ones: it is mounted over the others), or
    None when no line covers it."""
    best = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], tail[2] if len(tail) > 2 else "")
    return best


def huge_pages_of(fstype: str, options: str, shmem_enabled: str = "") -> str | None:
    """Pure: the huge-page mode of a mount of ``fstype`` with super ``options`` when the
    kernel's ``shmem_enabled`` file reads ``shmem_enabled`` (its chosen value in brackets;
    empty: unknown): "never", "always", "within_size" or "advise" for a tmpfs (``deny``
    makes every tmpfs "never", ``force`` "always"), None for any other filesystem.

    >>> huge_pages_of("tmpfs", "rw,huge=within_size", "always [never] deny force")
    'within_size'
    >>> huge_pages_of("tmpfs", "rw,huge=within_size", "always never [deny] force")
    'never'
    >>> huge_pages_of("tmpfs", "rw,size=1g"), huge_pages_of("ext4", "rw")
    ('never', None)
    """
    if fstype != "tmpfs":
        return None
    chosen = shmem_enabled.partition("[")[2].partition("]")[0]
    if chosen == "deny":
        return "never"
    if chosen == "force":
        return "always"
    for option in options.split(","):
        key, _, value = option.partition("=")
        if key == "huge" and value:
            return value
    return "never"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def describe(path: str, mountinfo: str = _MOUNTINFO,
             shmem_enabled: str = _SHMEM_ENABLED) -> tuple[bool | None, str | None]:
    """What the mount under ``path`` offers, each file read once: ``(memory_backed,
    huge_pages)`` as the two functions below answer them."""
    text = _read(mountinfo)
    found = None if text is None else mount_of(os.path.realpath(path), text)
    if found is None:
        return None, None
    huge = None if found[1] != "tmpfs" else \
        huge_pages_of(found[1], found[2], _read(shmem_enabled) or "")
    return found[1] in MEMORY_FILESYSTEMS, huge


def memory_backed(path: str, mountinfo: str = _MOUNTINFO) -> bool | None:
    """Whether ``path`` lies on a memory filesystem (tmpfs, ramfs, hugetlbfs), read from the
    file ``mountinfo``; None when that cannot be read."""
    return describe(path, mountinfo)[0]


def huge_pages(path: str, mountinfo: str = _MOUNTINFO,
               shmem_enabled: str = _SHMEM_ENABLED) -> str | None:
    """The huge-page mode of the tmpfs under ``path`` (``huge_pages_of``), from the files
    ``mountinfo`` and ``shmem_enabled``; None when ``path`` is on no tmpfs or the mounts
    cannot be read."""
    return describe(path, mountinfo, shmem_enabled)[1]
