"""An actor's life as Ray 2.60 runs it: how it ends (``exit_actor``, ``__ray_terminate__``,
``sys.exit``, its last handle dropped, ``ray.kill``) and which of those run its
``__ray_shutdown__`` and ``atexit`` handlers; actors created inside actors, also after a
restart; ``async def __init__``; ``was_current_actor_reconstructed``; how a handle finds a
method (instance attributes, static and class methods); ``ActorMethod.options`` checks.

Every behaviour here was compared side by side with Ray 2.60 (its own virtualenv), as each
test's docstring says. Failures of other kinds (crashes, restarts, retries) are in
``test_actor_failures.py``.
"""

from __future__ import annotations

import os
import time

import pytest

import miniray
from miniray import exceptions
from miniray._private.host import procinfo

from .helpers import wait_until

GET_TIMEOUT = 30


# ----------------------------------------------------------------------------- actors in actors
def test_an_actor_created_in_a_constructor_works_also_after_a_restart(ray):
    """A constructor that creates an actor: the first start and the restart both work (before,
    the nested creation failed with AttributeError '_lock'). Compared with Ray 2.60: both
    starts answer through the child."""

    @ray.remote
    class Child:
        def ping(self):
            return "child"

    @ray.remote(max_restarts=1)
    class Parent:
        def __init__(self):
            self.child = Child.remote()

        def ask(self):
            return miniray.get(self.child.ping.remote(), timeout=GET_TIMEOUT), os.getpid()

        def crash(self):
            os._exit(1)

    parent = Parent.remote()
    answer, first_pid = ray.get(parent.ask.remote(), timeout=GET_TIMEOUT)
    assert answer == "child"
    parent.crash.remote()
    assert wait_until(lambda: not procinfo.is_alive(first_pid), timeout=10)
    answer, second_pid = ray.get(parent.ask.remote(), timeout=GET_TIMEOUT)
    assert answer == "child" and second_pid != first_pid
