"""The driver's files in its session: its object store's folders, its published statistics,
and their removal at ``shutdown()`` (teardown step 5 of ARCHITECTURE.md).

Owns: making the driver's object store (``_make_store``: the shm dir checked and dead
sessions' segments swept, the spill folders: ``_spill_dir``, ``_spill_top``), the paths a
driver gives its workers (``_driver_sys_path``), and the methods of ``runtime.Runtime`` (a
mixin of it, ``SessionFiles``: every attribute is the Runtime's) that publish a joined
driver's store statistics to its node (``_publish_store_stats``) and remove the session's
files, or only this driver's, when it shuts down (``_release_session``,
``_remove_driver_dirs``).
Does not own: the session directory's layout and its sweeps (``host/session.py``), the
store (``object_store/shm_store.py``), or the teardown order (``Runtime.shutdown``).
Called by: ``runtime.Runtime`` (its start, its I/O thread's timer, its ``shutdown``).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from miniray._private.core import config
from miniray._private.host import session
from miniray._private.object_store import shm_segments

__all__ = ["SessionFiles"]

logger = logging.getLogger("miniray")


class SessionFiles:
    """``Runtime``'s session-file methods (see the module docstring)."""

    def _release_session(self) -> None:
        try:
            self.ledger.release_holder(self.pid)
        except Exception:
            pass
        if self.node_client is not None:  # the session belongs to the node: leave it
            self.node_client.close()
            try:
                self.ledger.close()
            except Exception:
                pass
            self._remove_driver_dirs()
            logger.debug("disconnected from node %s", self.address)
            return
        spill = _spill_dir(self.session_dir)
        session.remove_session_dir(self.session_dir)
        if not spill.startswith(self.session_dir):
            import shutil

            shutil.rmtree(spill, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(spill))
            except OSError:
                pass
        logger.debug("session %s shut down", self.session_name)

    STATS_EVERY_S = 1.0

    def _publish_store_stats(self) -> None:
        """A driver that joined a node writes its store's statistics and its demands (what
        waits for resources) into the node's session once a second (only when they change),
        for ``miniray status``. Runs on the I/O thread's timer."""
        if self._shut:
            return
        try:
            stats = self.store.statistics()
            published = {k: stats[k] for k in ("objects", "bytes_in_memory", "bytes_spilled",
                                               "pinned", "capacity")}
            # What waits for resources, by function name and shape (`miniray status -v`).
            published["demands"] = self.owner.waits.demands
            text = json.dumps(published)
            if text != getattr(self, "_last_stats", None):
                folder = os.path.join(self.session_dir, session.STORE_STATS_DIR)
                try:  # never re-create the node's session directory once it was removed
                    os.mkdir(folder)
                except FileExistsError:
                    pass
                path = os.path.join(folder, f"{self.pid}.json")
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.replace(path + ".tmp", path)
                self._last_stats = text
        except (OSError, KeyError):
            pass
        self.owner.reactor.call_later(self.STATS_EVERY_S, self._publish_store_stats)

    def _remove_driver_dirs(self) -> None:
        import shutil

        try:
            os.unlink(os.path.join(self.session_dir, session.STORE_STATS_DIR, f"{self.pid}.json"))
        except OSError:
            pass
        name = f"driver_{self.pid}"
        shutil.rmtree(os.path.join(_spill_dir(self.session_dir), name), ignore_errors=True)
        shutil.rmtree(os.path.join(self.session_dir, "objects", name), ignore_errors=True)


def _spill_dir(session_dir: str) -> str:
    return session.spill_dir(session_dir)


def _spill_top(session_dir: str) -> str:
    """The highest private directory above a session's spill folders: the session itself, or
    the per-user spill root under the temp dir (``<tmp>/miniray-spill-<uid>``)."""
    spill = _spill_dir(session_dir)
    return session_dir if spill.startswith(session_dir) else os.path.dirname(spill)


def _make_store(session_dir: str, capacity: int, driver: str | None = None):
    from miniray._private.host import same_uid  # lazy: see the note at the imports
    from miniray._private.object_store.shm_store import (
        SharedMemoryStore,  # lazy: see the note at the imports
    )

    # Segments of sessions whose owner is provably dead (SIGKILL) go first; then this
    # session's store. The spill root is checked before anything in it is listed or removed.
    shm_dir = shm_segments.prepare_shm_dir(config.shm_dir())  # MINIRAY_SHM_DIR, checked
    shm_segments.sweep_dead_segments(shm_dir)
    top = _spill_top(session_dir)
    if top != session_dir:
        same_uid.ensure_private_dir(top, remedy="set TMPDIR to a private directory of your own")
        session.sweep_dead_spill_dirs(top)
    tag = shm_segments.new_session_tag(root=session.root_tag(os.path.dirname(session_dir)))
    spill = _spill_dir(session_dir)
    objects = os.path.join(session_dir, "objects")
    if driver:  # several drivers share a node's session: each keeps its own files
        spill, objects = os.path.join(spill, driver), os.path.join(objects, driver)
    return SharedMemoryStore(tag, capacity, spill, shm_dir=shm_dir, fallback_dir=objects,
                             private_top=top)


def _driver_sys_path() -> list[str]:
    paths = []
    for path in sys.path:
        path = os.path.abspath(path) if path else os.getcwd()
        if path not in paths:
            paths.append(path)
    return paths
