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
    with pytest.raises(exceptions.ActorUnavailableError):  # the call lost with the process
        ray.get(parent.crash.remote(), timeout=GET_TIMEOUT)
    answer, second_pid = ray.get(parent.ask.remote(), timeout=GET_TIMEOUT)
    assert answer == "child" and second_pid != first_pid


# ----------------------------------------------------------------------------- method lookup
def test_an_instance_attribute_does_not_hide_a_method_of_the_same_name(ray):
    """``self.flag = False`` beside ``def flag``: the handle calls the method. Compared with
    Ray 2.60, which answers "method" (miniray called the bool before)."""

    @ray.remote
    class Shadowed:
        def __init__(self):
            self.flag = False

        def flag(self):
            return "method", self.__dict__["flag"]

    actor = Shadowed.remote()
    assert ray.get(actor.flag.remote(), timeout=GET_TIMEOUT) == ("method", False)


def test_static_and_class_methods_are_called_through_a_handle(ray):
    """Compared with Ray 2.60: both run in the actor, and a call that does not fit their
    signature fails at ``.remote()`` with TypeError (Ray: "too many positional arguments",
    "missing a required argument: 'x'")."""

    @ray.remote
    class Tools:
        @staticmethod
        def static(x):
            return "static", x, os.getpid()

        @classmethod
        def klass(cls, x):
            return "class", cls.__name__, x

        def pid(self):
            return os.getpid()

    actor = Tools.remote()
    pid = ray.get(actor.pid.remote(), timeout=GET_TIMEOUT)
    assert ray.get(actor.static.remote(1), timeout=GET_TIMEOUT) == ("static", 1, pid)
    assert ray.get(actor.klass.remote(2), timeout=GET_TIMEOUT) == ("class", "Tools", 2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        actor.static.remote(1, 2)
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        actor.klass.remote()
