"""Pure decisions of task pipelining: how many tasks a worker may hold, which lease takes the
next one, and what a worker hands back when it blocks.

Owns: the depth of a scheduling key (``depth_for``), picking the lease a task is queued on
behind another (``lease_to_fill``; an idle one is ``scheduling.lease_with_room``), the
worker asked to give its queued tasks to an idle one (``lease_to_recall``), the worker's
choice of what to hand back when it blocks in ``get()``/``wait()`` (``split_hand_back``).
Where a task that comes back goes in its queue is ``scheduling.queue_index``. Does not
own: sending, the queues or the leases (``owner/owner.py``, ``owner/tasks.py``), nor reading
the socket (``worker/worker_api.py``).
Called by: ``owner/owner.py`` and ``owner/tasks.py`` under the owner's lock, and
``worker/worker_api.py`` in a worker.

Why a worker may hold several tasks: each task costs the owner a round trip, and the worker
would idle between a result and the next task. Why it hands them back: a task queued behind
one that blocks in ``get()`` could be the very task it waits for. The worker is the authority
on what it started, so the owner never takes a task back on its own::

    owner ──TASK a, TASK b, TASK c──► worker (runs a; b and c wait in its inbox)
    a calls get(): worker ──GIVE_BACK [b, c]──► owner, then ──GET──►
                   owner requeues b, c at the front of their queue (no retry used), and
                   may send them to other workers; a TASK that reaches the worker while
                   it is blocked goes back the same way
    a worker of the key goes idle, nothing queued: owner ──RECALL──► the worker holding
                   the most tasks behind its running one, which answers GIVE_BACK
"""

from __future__ import annotations

__all__ = ["depth_for", "lease_to_fill", "lease_to_recall", "split_hand_back", "take_finished"]


def depth_for(key, default_depth: int) -> int:
    """The most tasks of scheduling ``key`` (request items, max_calls, runtime_env) a worker
    may hold at once, the running one included. One at a time for GPU tasks (a fresh worker
    per call by default in Ray, and a GPU task is rarely short) and for ``max_calls`` (the
    worker retires after N calls of a function: never send past it).

    >>> depth_for(((("CPU", 1.0),), 0, ""), 4)
    4
    >>> depth_for(((("CPU", 1.0), ("GPU", 1.0)), 0, ""), 4), depth_for(((), 3, ""), 4)
    (1, 1)
    """
    items, max_calls = key[0], key[1]
    if max_calls:
        return 1
    for name, amount in items:
        if name == "GPU" and amount:
            return 1
    return max(1, default_depth)


def lease_to_fill(leases, depth: int):
    """The lease whose worker holds the fewest tasks, fewer than ``depth``, and is not
    blocked in ``get()``/``wait()`` (it would hand them back at once), or None.

    >>> from types import SimpleNamespace as N
    >>> a, b = N(worker=N(blocked=0, inflight=[1, 2])), N(worker=N(blocked=0, inflight=[1]))
    >>> lease_to_fill([a, b], 2) is b, lease_to_fill([a, b], 1)
    (True, None)
    >>> lease_to_fill([N(worker=N(blocked=1, inflight=[1]))], 4) is None
    True
    """
    best = None
    least = depth
    for slot in leases or ():
        worker = slot.worker
        held = len(worker.inflight)
        if held < least and not worker.blocked:
            best, least = slot, held
            if held == 0:
                break
    return best


def lease_to_recall(leases):
    """A worker of the key just went idle with nothing queued: the lease whose worker holds
    the most tasks behind its running one (at least one), not blocked and not asked already,
    to be asked (``RECALL``) to give them back, or None. So a task never waits behind a long
    one while a worker that could run it idles.

    >>> from types import SimpleNamespace as N
    >>> a = N(worker=N(blocked=0, recalled=False, inflight=[1, 2]))
    >>> b = N(worker=N(blocked=0, recalled=False, inflight=[1, 2, 3]))
    >>> lease_to_recall([a, b]) is b, lease_to_recall([N(worker=N(blocked=0, recalled=True,
    ...                                                             inflight=[1, 2]))])
    (True, None)
    """
    best = None
    most = 1
    for slot in leases or ():
        worker = slot.worker
        held = len(worker.inflight)
        if held > most and not worker.blocked and not worker.recalled:
            best, most = slot, held
    return best


def split_hand_back(messages, task_tag: int) -> tuple[list, list]:
    """A worker blocks in ``get()``/``wait()``: of the messages waiting in its inbox, the
    tasks go back to the owner (their ids, in the order received) and everything else stays
    (a function's pickle, an unmap, ...). Returns ``(kept, task_ids)``.

    >>> split_hand_back([(1, b"f"), (2, b"a"), (7, "p"), (2, b"b")], 2)
    ([(1, b'f'), (7, 'p')], [b'a', b'b'])
    """
    kept, task_ids = [], []
    for message in messages:
        if message[0] == task_tag:
            task_ids.append(message[1])
        else:
            kept.append(message)
    return kept, task_ids


def take_finished(inflight, task_id: bytes):
    """``(task, in_order)``: the task of ``task_id`` taken out of a worker's in-flight deque,
    and whether it was the first (the worker runs its tasks in order, and writes a GIVE_BACK
    before the result of any task it received later, so a result is normally the first's).
    A result out of that order is still taken by its id: the tasks before it stay in flight
    (run later, or given back), where refusing it would leave its task in flight forever.
    ``(None, False)`` when no task of that id is in flight.

    Example:
        >>> from collections import deque
        >>> from types import SimpleNamespace as T
        >>> inflight = deque(T(spec=T(task_id=i)) for i in (b"a", b"b"))
        >>> task, in_order = take_finished(inflight, b"b")
        >>> task.spec.task_id, in_order, [t.spec.task_id for t in inflight]
        (b'b', False, [b'a'])
    """
    if inflight and inflight[0].spec.task_id == task_id:
        return inflight.popleft(), True
    for index, task in enumerate(inflight):
        if task.spec.task_id == task_id:
            del inflight[index]
            return task, False
    return None, False
