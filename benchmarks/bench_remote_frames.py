"""The cost of authenticating a remote worker's data frames, two ways (peering design 4.3).

A task's frames between a driver on host A and a worker on host B must carry a MAC (#16:
"every frame authenticated"). Two designs:

* **A, MAC in the worker**: the worker speaks ``peer_wire``'s FrameWriter/FrameReader on its
  TCP data socket, with keys its node hands it through the fork server;
* **B, relay through the node**: the worker keeps today's local socket to its node; the node
  checks the MAC of each frame from the driver and forwards the payload (and MACs the
  answers): one more process on the path.

What it measures, in one run (fake hosts: the driver on 127.0.0.1, the other side on
127.0.0.2; TCP_NODELAY; each a process of its own):

* ``mac_us``: the CPU cost per frame of ``FrameWriter.encode`` + ``FrameReader.feed`` (MAC
  on) against the same framing with the MAC off (``mac=False``), for small payloads
  (64 B, 512 B, 4 KiB), in µs per frame (one side's send plus the other's check);
* ``rtt_us``: a ping-pong of 200-byte payloads, ``--count`` timed after 200 warm-up,
  p50 and mean in µs: ``raw`` (plain TCP, the floor), ``mac_direct`` (design A: MAC'd
  frames end to end), ``relay`` (design B: MAC'd frames to a relay process on 127.0.0.2,
  which checks them and passes the payload over an AF_UNIX socketpair to the worker
  process, and MACs its answer back). The relay is a blocking loop, the cheapest relay
  there is: the node's selector loop would only add to it.

    python benchmarks/bench_remote_frames.py [--count 3000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import struct
import time

from miniray._private.transport import peer_wire as pw

KEY_C2S = b"c" * 32
KEY_S2C = b"s" * 32
PAYLOAD = 200
WARMUP = 200
_LEN = struct.Struct("!I")


def mac_cost(size: int, rounds: int, mac: bool) -> float:
    writer = pw.FrameWriter(KEY_C2S, mac=mac)
    reader = pw.FrameReader(KEY_C2S, mac=mac)
    payload = os.urandom(size)
    t0 = time.perf_counter()
    for _ in range(rounds):
        frame = b"".join(writer.encode(payload))
        (got,) = reader.feed(frame)
    took = time.perf_counter() - t0
    assert bytes(got) == payload
    return took / rounds * 1e6


# ------------------------------------------------------------------------- the peers
def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv_frame(sock, reader: pw.FrameReader):
    while True:
        data = sock.recv(65536)
        if not data:
            raise EOFError
        frames = reader.feed(data)
        if frames:
            return frames[0]


def _listen(ip: str):
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((ip, 0))
    lsock.listen(1)
    return lsock


def _accept(lsock):
    conn, _ = lsock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def serve_raw(lsock) -> None:
    conn = _accept(lsock)
    try:
        while True:
            conn.sendall(_recv_exact(conn, PAYLOAD))
    except (EOFError, OSError):
        pass


def serve_mac(lsock) -> None:
    conn = _accept(lsock)
    reader, writer = pw.FrameReader(KEY_C2S), pw.FrameWriter(KEY_S2C)
    try:
        while True:
            payload = _recv_frame(conn, reader)
            conn.sendall(b"".join(writer.encode(payload)))
    except (EOFError, OSError):
        pass


def serve_relay(lsock) -> None:
    """The node: MAC'd frames from the driver, plain length-prefixed ones to the worker."""
    inner, worker_end = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the worker: today's local framing, no MAC
        inner.close()
        try:
            while True:
                (n,) = _LEN.unpack(_recv_exact(worker_end, 4))
                payload = _recv_exact(worker_end, n)
                worker_end.sendall(_LEN.pack(len(payload)) + payload)
        except (EOFError, OSError):
            os._exit(0)
    worker_end.close()
    conn = _accept(lsock)
    reader, writer = pw.FrameReader(KEY_C2S), pw.FrameWriter(KEY_S2C)
    try:
        while True:
            payload = _recv_frame(conn, reader)
            inner.sendall(_LEN.pack(len(payload)) + bytes(payload))
            (n,) = _LEN.unpack(_recv_exact(inner, 4))
            answer = _recv_exact(inner, n)
            conn.sendall(b"".join(writer.encode(answer)))
    except (EOFError, OSError):
        pass
    inner.close()
    os.waitpid(pid, 0)


SERVERS = {"raw": serve_raw, "mac_direct": serve_mac, "relay": serve_relay}


def ping_pong(mode: str, count: int) -> dict:
    lsock = _listen("127.0.0.2")
    port = lsock.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=SERVERS[mode], args=(lsock,))
    proc.start()
    lsock.close()
    sock = socket.create_connection(("127.0.0.2", port), source_address=("127.0.0.1", 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = os.urandom(PAYLOAD)
    writer, reader = pw.FrameWriter(KEY_C2S), pw.FrameReader(KEY_S2C)
    times = []
    try:
        for i in range(WARMUP + count):
            t0 = time.perf_counter()
            if mode == "raw":
                sock.sendall(payload)
                got = _recv_exact(sock, PAYLOAD)
            else:
                sock.sendall(b"".join(writer.encode(payload)))
                got = _recv_frame(sock, reader)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
            assert bytes(got) == payload
    finally:
        sock.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    times.sort()
    return {"p50": round(statistics.median(times) * 1e6, 1),
            "mean": round(statistics.fmean(times) * 1e6, 1),
            "p99": round(times[int(len(times) * 0.99)] * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    mac_us = {}
    for size in (64, 512, 4096):
        on = min(mac_cost(size, 20000, True) for _ in range(3))
        off = min(mac_cost(size, 20000, False) for _ in range(3))
        mac_us[f"{size}B"] = {"mac": round(on, 2), "no_mac": round(off, 2),
                              "mac_adds": round(on - off, 2)}
    rtt_us = {mode: ping_pong(mode, args.count) for mode in ("raw", "mac_direct", "relay")}
    rtt_us["relay_adds_p50"] = round(rtt_us["relay"]["p50"] - rtt_us["mac_direct"]["p50"], 1)
    rtt_us["mac_adds_p50"] = round(rtt_us["mac_direct"]["p50"] - rtt_us["raw"]["p50"], 1)
    print(json.dumps({"mac_us": mac_us, "rtt_us": rtt_us, "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
