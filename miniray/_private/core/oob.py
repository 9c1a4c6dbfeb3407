"""Out-of-band serialization, and the byte layout of an object segment.

Owns: turning a value into a pickle stream plus the raw buffers it refers to (pickle protocol 5
``buffer_callback``), the layout of those pieces in a segment, writing that layout into a file
descriptor (``pwritev``) or into a writable mapping (one memcpy per buffer), and loading a value
back from a mapping without copying its buffers. Does not own: file names, capacity, spilling
or lifetimes (``shm_store.py``).
Called by: shm_store.py, in the owner and in workers; serialization.py (call arguments);
``object_store/parallel_write.py`` copies ``pieces()`` on several threads instead of
``write_fd`` for large new segments where the CPUs allow (numpy is imported there, not here).

Numpy arrays (and anything whose ``__reduce_ex__(5)`` hands out ``pickle.PickleBuffer``) are not
copied into the pickle stream: the stream keeps a placeholder and the array's memory is written
straight into the segment. Loading from a read-only mapping gives arrays that view the segment,
with ``flags.writeable == False``. numpy is never imported here.

Segment layout (integers little-endian)::

    offset 0     magic b"MRSG" | version u16 | flags u16 | metadata length u64 | buffer count u64
    offset 24    buffer table: count x (offset u64, length u64)
    24 + 16n     metadata: the pickle stream, with placeholders for the buffers
    aligned      buffer 0, buffer 1, ...   each starting at a multiple of 64 bytes
    total_size   end of the last buffer (the file of a recycled segment may be longer: readers
                 trust the header, never the file size)
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

import cloudpickle

__all__ = ["ALIGN", "Serialized", "inline_blob", "join_inline", "load_segment", "loads_inline",
           "serialize"]

PROTOCOL = 5
MAGIC = b"MRSG"
VERSION = 1
ALIGN = 64  # cache-line aligned buffers: numpy's SIMD loops and memcpy prefer it
_HEADER = struct.Struct("<4sHHQQ")
_ENTRY_SIZE = 16
_ZEROS = bytes(ALIGN)
_IOV_MAX = 1024  # Linux's limit on iovecs per pwritev call
_MAX_WRITE = 0x7FFFF000  # Linux writes at most this many bytes per call


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Serialized:
    """A value as a pickle stream plus out-of-band buffers, with their segment layout.

    Attributes:
        metadata: The pickle stream (protocol 5) with placeholders for ``buffers``.
        buffers: One flat byte view (format ``B``) per out-of-band buffer, still viewing the
            original value's memory: nothing was copied.
        offsets: Where each buffer starts in the segment (multiples of 64).
        total_size: Bytes the segment needs: header, metadata and aligned buffers.
    """

    __slots__ = ("metadata", "buffers", "offsets", "total_size", "_header", "_value")

    def __init__(self, metadata: bytes, buffers: list[memoryview], value: Any):
        self.metadata = metadata
        self.buffers = buffers
        self._value = value
        table_end = _HEADER.size + _ENTRY_SIZE * len(buffers)
        pos = table_end + len(metadata)
        offsets = []
        for buf in buffers:
            start = _align(pos)
            offsets.append(start)
            pos = start + buf.nbytes
        self.offsets = offsets
        self.total_size = pos
        entries = [n for off, buf in zip(offsets, buffers) for n in (off, buf.nbytes)]
        self._header = _HEADER.pack(MAGIC, VERSION, 0, len(metadata), len(buffers)) + struct.pack(
            f"<{len(entries)}Q", *entries
        )

    @property
    def payload_size(self) -> int:
        """Metadata plus buffers, without header or padding: what an inline copy costs."""
        return len(self.metadata) + sum(buf.nbytes for buf in self.buffers)

    def inband(self) -> bytes:
        """One self-contained pickle (buffers inside the stream), loadable by ``pickle.loads``.

        With no out-of-band buffers this is ``metadata`` itself (a callback that is never
        called leaves the stream unchanged); otherwise the value is pickled again in-band,
        which only happens for small values, so the second pass is cheap.
        """
        if not self.buffers:
            return self.metadata
        return cloudpickle.dumps(self._value, protocol=PROTOCOL)

    def pieces(self) -> list:
        """Byte pieces that cover ``[0, total_size)`` in order, padding included."""
        out: list = [self._header, self.metadata]
        pos = len(self._header) + len(self.metadata)
        for off, buf in zip(self.offsets, self.buffers):
            if off > pos:
                out.append(_ZEROS[: off - pos])
            out.append(buf)
            pos = off + buf.nbytes
        return out

    def write_into(self, view: memoryview) -> None:
        """Copy the segment into a writable byte view of at least ``total_size`` bytes.

        One memcpy per piece; padding is left as it is (readers never look at it).
        """
        head = len(self._header)
        view[:head] = self._header
        view[head : head + len(self.metadata)] = self.metadata
        for off, buf in zip(self.offsets, self.buffers):
            view[off : off + buf.nbytes] = buf

    def write_fd(self, fd: int) -> None:
        """Write the segment at offset 0 of ``fd`` with as few ``pwritev`` calls as possible.

        Used for fresh files: the kernel copies straight into newly allocated pages, which is
        faster than faulting in a fresh mapping page by page, and a full tmpfs answers ENOSPC
        (an OSError) instead of SIGBUS.
        """
        pieces = [memoryview(p).cast("B") for p in self.pieces()]
        offset = 0
        i = 0
        while i < len(pieces):
            batch, size = [], 0
            for piece in pieces[i : i + _IOV_MAX]:
                if size + piece.nbytes > _MAX_WRITE:
                    if not batch:
                        batch.append(piece[:_MAX_WRITE])
                    break
                batch.append(piece)
                size += piece.nbytes
            written = os.pwritev(fd, batch, offset)
            if written <= 0:
                raise OSError(f"pwritev wrote {written} bytes at offset {offset}")
            offset += written
            # Drop the pieces fully written (empty ones after them too: a batch of nothing
            # but empty pieces writes 0 bytes); keep the unwritten tail of a partly written one.
            while i < len(pieces) and (written or not pieces[i].nbytes):
                n = pieces[i].nbytes
                if written >= n:
                    written -= n
                    i += 1
                else:
                    pieces[i] = pieces[i][written:]
                    written = 0


def serialize(value: Any) -> Serialized:
    """Pickle ``value`` with protocol 5, keeping contiguous buffers out of band.

    Example:
        >>> s = serialize({"a": 1})
        >>> s.buffers, loads_inline(s.inband())
        ([], {'a': 1})
    """
    buffers: list[memoryview] = []

    def keep(pickle_buffer: pickle.PickleBuffer) -> bool:
        buffers.append(pickle_buffer.raw())
        return False  # false: out of band

    metadata = cloudpickle.dumps(value, protocol=PROTOCOL, buffer_callback=keep)
    return Serialized(metadata, buffers, value)


_INLINE_MAGIC = b"MRB1"
_U64 = struct.Struct("<Q")


def inline_blob(ser: Serialized) -> bytes:
    """A small value as one bytes object. Without buffers: the plain pickle. With buffers
    (numpy arrays): ``MRB1``, the count and lengths, the metadata, then each buffer 8-byte
    aligned, so ``loads_inline`` hands the arrays read-only views of the blob (as Ray does
    for every numpy array it returns, small ones included) without copying them."""
    return join_inline(ser.metadata, ser.buffers)


def join_inline(metadata: bytes, buffers: list) -> bytes:
    """``inline_blob`` of a pickle stream and its out-of-band buffers (byte views)."""
    if not buffers:
        return metadata
    raws = [memoryview(b).cast("B") for b in buffers]
    head = [_INLINE_MAGIC, _U64.pack(len(raws)), _U64.pack(len(metadata))]
    head += [_U64.pack(len(r)) for r in raws]
    parts = head + [metadata]
    size = sum(len(p) for p in parts)
    for raw in raws:
        pad = -size % 8
        parts.append(b"\0" * pad)
        parts.append(raw)
        size += pad + len(raw)
    return b"".join(parts)


def loads_inline(data: bytes) -> Any:
    """Load an inline object: a plain pickle, or an ``inline_blob`` with its buffers."""
    if data[:4] != _INLINE_MAGIC:
        return pickle.loads(data)
    view = memoryview(data).toreadonly()
    count = _U64.unpack_from(data, 4)[0]
    meta_len = _U64.unpack_from(data, 12)[0]
    lengths = [_U64.unpack_from(data, 20 + 8 * i)[0] for i in range(count)]
    offset = 20 + 8 * count
    metadata = view[offset:offset + meta_len]
    offset += meta_len
    buffers = []
    for length in lengths:
        offset += -offset % 8
        buffers.append(view[offset:offset + length])
        offset += length
    return pickle.loads(metadata, buffers=buffers)


def load_segment(view: memoryview, where: str = "segment") -> Any:
    """Load the value a segment holds; its buffers are views of ``view`` (no copy).

    ``view`` keeps its exporter (the mapping) alive for as long as any loaded array exists.
    Raises ValueError naming ``where`` when the bytes are not a miniray segment.
    """
    if view.nbytes < _HEADER.size:
        raise ValueError(f"{where} is not a miniray object segment: only {view.nbytes} bytes")
    magic, version, _flags, meta_len, count = _HEADER.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(
            f"{where} is not a miniray object segment of version {VERSION} "
            f"(magic {magic!r}, version {version})"
        )
    table_end = _HEADER.size + _ENTRY_SIZE * count
    table = struct.unpack_from(f"<{2 * count}Q", view, _HEADER.size)
    end = max([table_end + meta_len] + [table[2 * i] + table[2 * i + 1] for i in range(count)])
    if end > view.nbytes:
        raise ValueError(
            f"{where} is truncated: its header needs {end} bytes, it has {view.nbytes}"
        )
    metadata = view[table_end : table_end + meta_len]
    buffers = [view[table[2 * i] : table[2 * i] + table[2 * i + 1]] for i in range(count)]
    return pickle.loads(metadata, buffers=buffers)
