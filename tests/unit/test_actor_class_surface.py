"""What an actor class and a handle show of the user's class, as Ray 2.60's do (each case
run there): the class's attributes through ``@remote``'s result, ``dir()`` of both, and the
error for subclassing an actor class. No runtime is started."""

from __future__ import annotations

import pytest

import miniray
from miniray.actor import ActorClassInheritanceException, ActorHandle


class Base:
    BASE = 2

    def inherited(self):
        return 1


@miniray.remote
class Counter(Base):
    LIMIT = 3

    @staticmethod
    def static():
        return 5

    @classmethod
    def klass(cls):
        return cls.LIMIT

    def method_one(self):
        return 0


def test_class_attributes_are_read_through_the_actor_class():
    assert (Counter.LIMIT, Counter.BASE, Counter.static(), Counter.klass()) == (3, 2, 5, 3)
    assert Counter.method_one.__qualname__ == "Counter.method_one"  # the plain function
    assert Counter.inherited.__qualname__ == "Base.inherited"
    with pytest.raises(AttributeError, match=r"'ActorClass\(Counter\)' object has no "
                                             r"attribute 'nope'"):
        Counter.nope  # noqa: B018
    with pytest.raises(AttributeError):
        Counter.__wrapped__  # noqa: B018 - dunders are never the class's (copy, pickle)
    Counter.extra = 4  # set on the actor class, as in Ray
    assert Counter.extra == 4 and not hasattr(Counter._cls, "extra")


def test_dir_of_the_actor_class_and_of_a_handle_lists_the_methods():
    public = sorted(n for n in dir(Counter) if not n.startswith("_"))
    assert {"bind", "options", "remote", "method_one", "static", "klass", "inherited",
            "LIMIT", "BASE"} <= set(public)
    handle = ActorHandle(b"\x01" * 16, ("Counter", Counter._methods, 0, ()))
    assert dir(handle) == ["__init__", "__ray_call__", "__ray_ready__", "__ray_terminate__",
                           "inherited", "klass", "method_one", "static"]


def test_subclassing_an_actor_class_is_refused_in_rays_words():
    with pytest.raises(ActorClassInheritanceException) as error:
        class Derived(Counter):  # noqa: F841
            pass
    assert str(error.value) == (
        "Attempted to define subclass 'Derived' of actor class 'Counter'. Inheriting from "
        "actor classes is not currently supported. You can instead inherit from a non-actor "
        "base class and make the derived class an actor class (with @ray.remote).")
    assert isinstance(error.value, TypeError)
