"""The actor manager's count of each actor's live handles.

Owns: the methods of ``actors.ActorManager`` (a mixin of it: the state is the manager's,
made in ``ActorManager.__init__``) that count handles: events queued without the lock (made
+1, dropped -1, pickled 0) and applied on the I/O thread (``apply_handle_events``), a
worker's handle events counted with the driver's, named actors kept for workers, and the
end of an actor whose last handle is gone (a ``__ray_terminate__`` call queued after its
other calls). For a proxy, the node's actor service is told whether this driver holds it.
Does not own: handles themselves (``miniray/actor.py``), the calls (``actor_calls.py``).
Called by: actor handles (``handle_event`` and its three cases, from any thread), the
owner's I/O thread (``apply_handle_events``), the owner's requests (``worker_handles``,
``keep_for_workers``: locked).
"""

from __future__ import annotations

from miniray._private.core import ids, serialization
from miniray._private.core.task_spec import ActorCallSpec
from miniray._private.owner.actor_records import A_DEAD, _Actor

_NO_ARGS = serialization.dumps(((), {}))


class ActorHandles:
    """``ActorManager``'s handle counting (see the module docstring); every attribute is the
    manager's."""

    def keep_for_workers(self, actor_id: bytes) -> None:
        """*Locked.* A worker got a handle to a named actor (``get_actor``, or its creation in
        the node's actor service): kept as if its handle had escaped (a name finds it
        again), and for a service actor this driver holds it until it disconnects. Other
        actors a worker makes or holds are counted from its handle events
        (``worker_handles``)."""
        actor = self.actors.get(actor_id)
        if actor is None or actor.escaped:
            return
        actor.escaped = True
        if actor.remote:
            self.link.hold(actor_id, True)

    def worker_handles(self, events: list) -> None:
        """*Locked.* A worker's actor handle events (a BORROW's ``handles``, in order):
        counted with the driver's own, so an actor whose last handle a worker dropped ends
        as when the driver drops its last one (Ray's rule, wherever the handle was made)."""
        for actor_id, delta in events:
            self.handle_event(actor_id, delta)

    def handle_event(self, actor_id: bytes, delta: int) -> None:
        """A handle to ``actor_id`` was made (+1), dropped (-1) or pickled (0); lock-free
        (a deque append: the I/O thread applies it, ``apply_handle_events``)."""
        if delta > 0:
            self.handle_created(actor_id)
        elif delta < 0:
            self.handle_dropped(actor_id)
        else:
            self.handle_pickled(actor_id)

    def handle_created(self, actor_id: bytes) -> None:
        self.handle_events.append((actor_id, 1))

    def handle_dropped(self, actor_id: bytes) -> None:
        first = not self.handle_events
        self.handle_events.append((actor_id, -1))
        if first:  # the I/O thread applies it (and the actor exits) even when all is idle
            self.owner.reactor.wake()

    def handle_pickled(self, actor_id: bytes) -> None:
        self.handle_events.append((actor_id, 0))

    def apply_handle_events(self) -> None:
        """When the last handle of a non-detached actor is gone, it exits after its calls."""
        events = self.handle_events
        while events:
            try:
                actor_id, delta = events.popleft()
            except IndexError:
                break
            actor = self.actors.get(actor_id)
            if actor is None:
                continue
            if delta == 0:
                actor.escaped = True
                continue
            actor.handles += delta
            if actor.remote:  # the service counts which drivers hold it
                if delta > 0 and actor.handles == 1:
                    self.link.hold(actor_id, True)
                elif actor.handles <= 0 and not actor.escaped:
                    self.link.hold(actor_id, False)
                continue
            if (delta < 0 and actor.handles <= 0 and not actor.escaped
                    and not actor.spec.detached and actor.state != A_DEAD):
                self._terminate_when_idle(actor)

    def _terminate_when_idle(self, actor: _Actor) -> None:
        """*Locked.* Its last handle is gone: it exits after the calls sent before, and its
        name is free at once (``get_actor`` fails, another actor may take it), as in Ray."""
        self.free_name(actor)
        task_id = ids.new_actor_task_id(actor.spec.actor_id)
        spec = ActorCallSpec(task_id, "__ray_terminate__", _NO_ARGS, None,
                             [ids.object_id_for(task_id, 1)], 1, "__ray_terminate__", 0)
        entry = self.owner.objects.ensure(spec.return_ids[0])
        entry.dropped = entry.read = True  # nobody will read it, nor hear of its error
        self.submit(actor.spec.actor_id, spec)
