"""One TLS connection relayed to a local socket (``transport/tls_relay.py``): a small round
trip and a 20 MB payload each way, measured between a TLS client and the relayed end.

    PYTHONPATH=$PWD python benchmarks/bench_tls_relay.py [--rounds 3] [--relays 1]

``--relays N`` opens N relayed connections and measures on the first while the others stay
idle (they share the relay's thread). Needs the ``openssl`` command (test certificates are
made in a temporary folder). Both ends share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import tempfile
import threading
import time

from miniray._private.transport import peer_channel as pc
from miniray._private.transport import peer_handshake as ph
from miniray._private.transport import tls_relay

TOKEN = b"b" * 64
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def make_certs(root: str) -> dict:
    def run(*args):
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True,
                       timeout=60)

    run("req", "-x509", *EC_KEY, "-days", "1", "-subj", "/CN=bench-ca", "-keyout", "ca.key",
        "-out", "ca.pem")
    for name in ("node", "client"):
        run("req", *EC_KEY, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out",
            f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-out", f"{name}.pem")
    return {name: (os.path.join(root, f"{name}.pem"), os.path.join(root, f"{name}.key"))
            for name in ("node", "client")} | {"ca": os.path.join(root, "ca.pem")}


def relayed_pair(listener, certs):
    server_ctx = ph.server_ssl_context(*certs["node"], certs["ca"])
    client_ctx = ph.client_ssl_context(*certs["client"], certs["ca"])
    box = {}

    def serve():
        conn, _ = listener.accept()
        box["server"] = ph.accept(conn, TOKEN, ssl_context=server_ctx)

    thread = threading.Thread(target=serve)
    thread.start()
    client = ph.connect(listener.getsockname(), TOKEN, "attach", ssl_context=client_ctx)
    thread.join()
    fd, state = box["server"].handover()
    return client, pc.PeerChannel.from_state(socket.socket(fileno=fd), state)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--relays", type=int, default=1)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        certs = make_certs(root)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        pairs = [relayed_pair(listener, certs) for _ in range(args.relays)]
        client, moved = pairs[0]
        big = os.urandom(20 * 1000 * 1000)
        rtts, ups, downs = [], [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.calls):
                client.send_bytes(b"ping")
                moved.recv_bytes(timeout=5)
                moved.send_bytes(b"pong")
                client.recv_bytes(timeout=5)
            rtts.append((time.perf_counter() - start) / args.calls * 1e6)
            for sender, receiver, out in ((client, moved, ups), (moved, client, downs)):
                thread = threading.Thread(target=sender.send_bytes, args=(big,))
                start = time.perf_counter()
                thread.start()
                got = receiver.recv_bytes(timeout=60)
                out.append(time.perf_counter() - start)
                thread.join()
                assert len(got) == len(big)
        print(f"relays={args.relays} threads={threading.active_count()} "
              f"(relays live: {tls_relay.live()})")
        print(f"small round trip (client -> relayed end -> client): best "
              f"{min(rtts):.0f} us, all {[round(r) for r in rtts]}")
        print(f"20 MB client -> relayed end: best {min(ups) * 1000:.0f} ms "
              f"({20 / min(ups) / 1000:.2f} GB/s); relayed end -> client: best "
              f"{min(downs) * 1000:.0f} ms ({20 / min(downs) / 1000:.2f} GB/s)")
        for client, moved in pairs:
            client.close()
            moved.close()
        listener.close()


if __name__ == "__main__":
    main()
