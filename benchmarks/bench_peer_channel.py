"""Throughput of one large payload over loopback TCP: raw sockets against the peer channel.

What it measures (all in one run, the receiver in a second process, each figure the best of
``--rounds``): a ``--mb`` MiB payload sent and received into a preallocated buffer, timed
from the first byte sent to the receiver's 1-byte acknowledgement:

* ``raw``: ``sendall`` / ``recv_into`` on a plain socket (the floor);
* ``channel_nomac``: ``PeerChannel.send_bytes`` / ``recv_bytes_into`` with the frame MAC
  switched off (framing and chunking only; never used outside this benchmark);
* ``channel_mac``: the same with HMAC-SHA256 on every frame (what peers use);
* ``channel_tls``: the channel inside TLS (mutual certificates from the ``openssl`` command;
  skipped when it is missing), MAC on.

Prints one JSON object: GB/s per mode and each mode's ratio to ``raw``.

    python benchmarks/bench_peer_channel.py [--mb 200] [--rounds 3] [--no-pipeline]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport import peer_wire

TOKEN = b"benchmark-token-" * 4
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _certs(root: str) -> dict:
    return {name: (os.path.join(root, f"{name}.pem"), os.path.join(root, f"{name}.key"))
            for name in ("node", "client")} | {"ca": os.path.join(root, "ca.pem")}


def _make_certs(root: str) -> bool:
    if not shutil.which("openssl"):
        return False

    def run(*args):
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    run("req", "-x509", *EC_KEY, "-days", "1", "-subj", "/CN=ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    for name in ("node", "client"):
        run("req", *EC_KEY, "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem")
    return True


def _no_mac(channel: pc.PeerChannel, key_send: bytes, key_recv: bytes) -> None:
    channel._writer = pc.FrameWriter(key_send, mac=False)
    channel._reader = pc.FrameReader(key_recv, mac=False)


def receiver(size: int, rounds: int, cert_dir: str | None) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    print(listener.getsockname()[1], flush=True)
    buffer = bytearray(size)
    view = memoryview(buffer)
    # raw
    conn, _ = listener.accept()
    with conn:
        for _ in range(rounds):
            got = 0
            while got < size:
                n = conn.recv_into(view[got:])
                if not n:
                    raise SystemExit("raw: sender closed early")
                got += n
            conn.sendall(b"!")
    certs = _certs(cert_dir) if cert_dir else None
    modes = ["channel_nomac", "channel_mac"] + (["channel_tls"] if certs else [])
    for mode in modes:
        context = (ph.server_ssl_context(*certs["node"], certs["ca"])
                   if mode == "channel_tls" else None)
        conn, _ = listener.accept()
        channel = ph.accept(conn, TOKEN, ssl_context=context, timeout=30)
        with channel:
            if mode == "channel_nomac":  # switched once the sender has (it says so, MAC'd)
                assert channel.recv_bytes(timeout=60) == b"nomac"
                _no_mac(channel, b"x", b"x")
            channel.send_bytes(b"ready")
            for _ in range(rounds):
                assert channel.recv_bytes_into(buffer) == size
                channel.send_bytes(b"!")
    listener.close()


def sender(port: int, size: int, rounds: int, cert_dir: str | None) -> dict:
    payload = os.urandom(size)
    best: dict[str, float] = {}
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            start = time.perf_counter()
            sock.sendall(payload)
            assert sock.recv(1) == b"!"
            best["raw"] = min(best.get("raw", 1e9), time.perf_counter() - start)
    certs = _certs(cert_dir) if cert_dir else None
    modes = ["channel_nomac", "channel_mac"] + (["channel_tls"] if certs else [])
    for mode in modes:
        context = (ph.client_ssl_context(*certs["client"], certs["ca"])
                   if mode == "channel_tls" else None)
        channel = ph.connect(("127.0.0.1", port), TOKEN, "bench", ssl_context=context,
                             timeout=30)
        with channel:
            if mode == "channel_nomac":
                channel.send_bytes(b"nomac")
                _no_mac(channel, b"x", b"x")
            assert channel.recv_bytes(timeout=60) == b"ready"
            for _ in range(rounds):
                start = time.perf_counter()
                channel.send_bytes(payload)
                assert channel.recv_bytes(timeout=60) == b"!"
                best[mode] = min(best.get(mode, 1e9), time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="payload size in MiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode (best kept)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="hash large frames in the sending/receiving thread itself "
                             "(no helper thread): what the helper thread buys")
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = args.mb << 20
    if args.no_pipeline:
        peer_wire.PIPELINE_MIN = 1 << 62
    if args.receiver:
        receiver(size, args.rounds, args.cert_dir or None)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cert_dir = tmp if _make_certs(tmp) else ""
        proc = subprocess.Popen([sys.executable, __file__, "--receiver", "--mb", str(args.mb),
                                 "--rounds", str(args.rounds), "--cert-dir", cert_dir]
                                + (["--no-pipeline"] if args.no_pipeline else []),
                                stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            best = sender(port, size, args.rounds, cert_dir or None)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    gbps = {mode: round(size / seconds / 1e9, 3) for mode, seconds in best.items()}
    print(json.dumps({"payload_mib": args.mb, "rounds": args.rounds,
                      "mac_thread": not args.no_pipeline, "gb_per_s": gbps,
                      "ratio_to_raw": {mode: round(v / gbps["raw"], 3)
                                       for mode, v in gbps.items()}}, indent=1))


if __name__ == "__main__":
    main()
