"""Pipelined tasks under forced RECALLs and blocking gets: every round must finish.

Many rounds of short tasks, some of which block in ``get()`` on tasks they submit (so their
worker gives back what it holds), while a driver thread asks every worker holding tasks
behind its running one to give them back (``RECALL``) as fast as the owner answers. A round
that does not finish within ``ROUND_S`` fails with the owner's in-flight view: each worker's
tasks, whether it is blocked or asked, and the queues. A task given back or run in an order
the owner does not expect stays in flight for ever (the hang this guards against), so a stuck
round is a real failure, not a slow machine: a round takes well under a second here.
"""

from __future__ import annotations

import threading

from miniray import exceptions
from miniray._private import runtime
from miniray._private.core import protocol

ROUNDS = 100
TASKS = 200  # short tasks a round
NESTED = 4  # tasks a round that block in get() on tasks they submit
ROUND_S = 30.0


def _noop(i):
    return i


def _waits_on_children(i):
    import miniray

    child = miniray.remote(_noop)
    return sum(miniray.get([child.remote(i), child.remote(i + 1)]))


def _in_flight_view(owner) -> str:
    """What the owner believes: each worker's tasks in flight, blocked, asked to give back."""
    lines = []
    with owner.locked():
        for worker in list(owner.workers.by_fd.values()):
            names = [task.spec.task_id.hex()[:12] for task in worker.inflight]
            lines.append(f"worker pid={worker.pid} blocked={worker.blocked} "
                         f"recalled={worker.recalled} inflight={len(names)} {names}")
        for key, queue in owner.tasks.queues.items():
            lines.append(f"queue {key}: {len(queue)} tasks")
        lines.append(f"statistics: {owner.tasks.statistics()}")
    return "\n".join(lines)


def _recall_all(owner) -> None:
    """RECALL to every worker holding tasks behind its running one, as an idle worker's
    would, not waiting for one to go idle."""
    with owner.locked():
        for worker in list(owner.workers.by_fd.values()):
            if len(worker.inflight) > 1 and not worker.blocked and not worker.recalled:
                worker.recalled = True
                owner.send_control(worker, (protocol.RECALL,))


def test_rounds_of_pipelined_tasks_finish_under_forced_recalls_and_blocking_gets(ray):
    owner = runtime.current().owner
    noop = ray.remote(max_retries=0)(_noop)
    nested = ray.remote(max_retries=0)(_waits_on_children)
    ray.get([noop.remote(i) for i in range(50)])  # workers started, function exported
    stop = threading.Event()
    recalls = [0]

    def recaller():
        while not stop.is_set():
            _recall_all(owner)
            recalls[0] += 1
            stop.wait(0.001)

    thread = threading.Thread(target=recaller, daemon=True)
    thread.start()
    try:
        for round_ in range(ROUNDS):
            refs = [noop.remote(i) for i in range(TASKS)]
            for j in range(NESTED):  # among the short ones, so some are pipelined behind
                refs.insert((j + 1) * TASKS // (NESTED + 1), nested.remote(j))
            try:
                values = ray.get(refs, timeout=ROUND_S)
            except exceptions.GetTimeoutError:
                raise AssertionError(
                    f"round {round_} made no progress in {ROUND_S} s "
                    f"({sum(1 for r in refs if ray.wait([r], timeout=0)[0])} of {len(refs)} "
                    f"done); the owner's view:\n{_in_flight_view(owner)}") from None
            assert sorted(values) == sorted(list(range(TASKS)) + [2 * j + 1
                                                                  for j in range(NESTED)])
    finally:
        stop.set()
        thread.join(10)
    assert recalls[0] > ROUNDS
    handed_back = owner.tasks.statistics()["handed_back"]
    print(f"recall sweeps {recalls[0]}, tasks given back {handed_back}")
    assert handed_back > 0, "no task was given back: the test forced nothing"
