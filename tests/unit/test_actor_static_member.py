"""``actor_host.static_member`` answers as ``inspect.getattr_static`` does (how an actor's
method is found per call), for plain classes and the cases it hands to it."""

from __future__ import annotations

import abc
import inspect

import pytest

from miniray._private.worker.actor_host import static_member


class Base:
    def inherited(self):
        return 1

    @staticmethod
    def static():
        return 2

    @classmethod
    def klass(cls):
        return 3

    async def coro(self):
        return 4

    value = 5


class Child(Base):
    def inherited(self):  # overrides
        return 6

    def own(self):
        return 7


class Meta(type):
    def from_meta(cls):
        return 8

    @property
    def prop(cls):
        return 9


class WithMeta(Child, metaclass=Meta):
    pass


class Abstract(abc.ABC):  # noqa: B024 (an ABC with no abstract method, on purpose)
    def method(self):
        return 10


class ShadowedDictMeta(type):
    __dict__ = {"own": "shadowed"}  # a metaclass that hides the class dict


class Shadowed(metaclass=ShadowedDictMeta):
    def own(self):
        return 11


class PlainUnderMeta(Shadowed):
    pass


NAMES = ["inherited", "static", "klass", "coro", "value", "own", "from_meta", "prop",
         "method", "missing", "__init__", "__repr__", "mro"]


@pytest.mark.parametrize("cls", [Base, Child, WithMeta, Abstract, Shadowed, PlainUnderMeta])
@pytest.mark.parametrize("name", NAMES)
def test_the_same_answer_as_getattr_static(cls, name):
    try:
        expected = inspect.getattr_static(cls, name)
    except AttributeError:
        with pytest.raises(AttributeError):
            static_member(cls, name)
        return
    assert static_member(cls, name) is expected


def test_a_member_replaced_on_the_class_is_found_at_once():
    class A:
        def f(self):
            return 1

    first = static_member(A, "f")
    A.f = lambda self: 2
    assert static_member(A, "f") is not first
    assert static_member(A, "f") is inspect.getattr_static(A, "f")
