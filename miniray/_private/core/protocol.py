"""Message tags of miniray's two channels.

Owns: the integer tags and the tuple layout of every message. Does not own: framing (that is
``multiprocessing.connection`` on the data socket and one SOCK_SEQPACKET datagram per message on
the fork-server socket) or what a message makes happen.
Called by: owner.py, worker_main.py, worker_api.py, forkserver.py.

Driver ⇄ worker, on the worker's data socket (driver speaks first)::

    driver → worker                               worker → driver
    (HELLO, info)                                 (RESULT, task_id, results, app_retryable)
    (FUNC, fn_id, fn_bytes)                       (SUBMIT, spec)            nested task
    (TASK, task_id, fn_id, name, args_blob,       (PUT, object_id, kind, data)
           dep_values, return_ids, extra)         (GET, req_id, ids, timeout)
    (REPLY, req_id, payload)                      (WAIT, req_id, ids, num_returns, timeout)
    (EXIT,)                                       (CALL, req_id, method, args)

Actors (a worker that received ACTOR_INIT hosts one actor for the rest of its life)::

    (ACTOR_INIT, actor_id, fn_id, class_name,     (ACTOR_READY, actor_id, ok, error)
                 args_blob, dep_values, ctx)      (ACTOR_EXITING,)   graceful exit follows
    (ACTOR_CALL, task_id, method, args_blob,      (ACTOR_CREATE, spec)      nested creation
                 dep_values, return_ids,          (ACTOR_SUBMIT, actor_id, call) nested call
                 num_returns, call_name)

``results`` is a list of ``(kind, data)``, kind being OK or ERR and data pickled bytes.
A GET or WAIT marks the worker blocked (its CPU goes back to the ledger) until its REPLY.

Driver → worker control socket: ``(CANCEL, task_id)`` only.

Driver ⇄ fork server::

    (SPAWN, req_id) + 4 fds [data, control, stdout, stderr]   →   (SPAWNED, req_id, pid)
    (KILL, pid, signal)                                        →   (EXITED, pid, wait_status)
    (SHUTDOWN, grace_s)                                        →   (BYE,) then exit

A node speaks the same tags to its drivers (``node_client.NodeClient`` translates), plus
``(NODE_STOPPING, reason)`` before it stops.
"""

# driver -> worker
HELLO = 0
FUNC = 1
TASK = 2
REPLY = 3
EXIT = 4
ACTOR_INIT = 5
ACTOR_CALL = 6
UNMAP = 7   # (UNMAP, path): the object is freed; drop a cached mapping of that segment

# worker -> driver
RESULT = 10
SUBMIT = 11
PUT = 12
GET = 13
WAIT = 14
CALL = 15
ACTOR_READY = 16
ACTOR_EXITING = 17
ACTOR_CREATE = 18
ACTOR_SUBMIT = 19
BORROW = 21  # (BORROW, added_ids, dropped_ids, escaped_ids): refs this worker holds now

# control socket
CANCEL = 20

# fork server
SPAWN = 30
SPAWNED = 31
KILL = 32
EXITED = 33
SHUTDOWN = 34
BYE = 35
NODE_STOPPING = 36  # (NODE_STOPPING, reason): a node announces its stop to its drivers

# result kinds
OK = 0
ERR = 1
TIMEOUT = 2
