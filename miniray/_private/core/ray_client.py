"""Ray Client (``ray://``, ``ray.client()``, ``ray.util.connect``), refused with what to do.

Owns: the public names of Ray Client, each raising NotImplementedError that says how to reach
a miniray node instead. Ray Client proxies a driver's calls over gRPC to a remote cluster; a
miniray driver runs on the node's host (``init(address="auto")`` or ``host:port``), so there
is nothing to proxy to. ``init("ray://...")`` is refused the same way by the runtime.
Called by: ``miniray/__init__.py`` (``client``, ``ClientBuilder``), ``miniray/util``
(``connect``, ``disconnect``).
"""

from __future__ import annotations

__all__ = ["MESSAGE", "ClientBuilder", "client", "connect", "disconnect", "ray_url_refusal"]

MESSAGE = ("Ray Client (ray://, ray.client(), ray.util.connect) is not supported by miniray: "
           "run the driver on the node's host and connect with init(address='auto') or "
           "init(address='host:port'), or run the program on Ray to use Ray Client.")


def ray_url_refusal(address: str) -> str:
    """The NotImplementedError message of ``init(address="ray://...")``: the two ways to run
    the program on a Ray cluster instead, and how to reach a miniray node."""
    return (f"miniray does not implement Ray Client (address {address!r}). To run this "
            "program on a Ray cluster, submit it as a job: "
            "`ray job submit --address http://HEAD:8265 --working-dir . -- python script.py` "
            "for a program that says `import ray`, or "
            "`ray job submit --address http://HEAD:8265 --working-dir . -- "
            "miniray run --ray script.py` for one that says `import miniray as ray` "
            "(`miniray run --ray script.py` alone runs it on a local Ray). "
            "To use a miniray node, run the driver on the node's host with "
            "init(address='auto') or init(address='host:port').")


def client(address: str | None = None, _deprecation_warn_enabled: bool = True):
    """Refused: raises NotImplementedError naming how to connect instead."""
    raise NotImplementedError(MESSAGE)


class ClientBuilder:
    """Refused: creating one raises NotImplementedError naming how to connect instead."""

    def __init__(self, address: str | None = None) -> None:
        raise NotImplementedError(MESSAGE)


def connect(conn_str: str, secure: bool = False, metadata=None, connection_retries: int = 3,
            job_config=None, namespace: str | None = None, *, ignore_version: bool = False,
            _credentials=None, ray_init_kwargs=None):
    """Refused: raises NotImplementedError naming how to connect instead."""
    raise NotImplementedError(MESSAGE)


def disconnect():
    """Refused: raises NotImplementedError (there is no Ray Client connection to close)."""
    raise NotImplementedError(MESSAGE)
