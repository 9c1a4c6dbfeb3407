"""Actors: ``@remote`` on a class.

Mirrors ``ray.actor`` (Ray 2.60). Actors are not implemented yet in this version of miniray:
decorating a class works (so modules that define actors import), but creating an actor raises
NotImplementedError naming what is missing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor"]

_NOT_YET = ("Actors are not implemented in this version of miniray (tasks, objects and "
            "resources are); {what} cannot run yet.")


class ActorClass:
    """What ``@remote`` makes of a class."""

    def __init__(self, cls: type, options: dict):
        self.__ray_metadata__ = {"class": cls, "options": dict(options)}
        self._cls = cls
        self._options = dict(options)

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "Actors cannot be instantiated directly. Instead of "
            f"'{self._cls.__name__}()', use '{self._cls.__name__}.remote()'."
        )

    def remote(self, *args, **kwargs):
        raise NotImplementedError(_NOT_YET.format(what=f"{self._cls.__name__}.remote()"))

    def options(self, **options: Any):
        return self

    def bind(self, *args, **kwargs):
        raise NotImplementedError("Ray DAGs (.bind) are not implemented by miniray.")


class ActorHandle:
    """A handle to an actor."""

    def _kill(self, no_restart: bool = True) -> None:
        raise NotImplementedError(_NOT_YET.format(what="ray.kill()"))


class ActorMethod:
    """A method of an actor handle."""


def make_actor_class(cls: type, options: dict) -> ActorClass:
    from miniray._private import options as _options

    _options.validate_actor_options(options, in_options=False)
    return ActorClass(cls, options)


def get_actor(name: str, namespace: str | None = None):
    if not name:
        raise ValueError("Please supply a non-empty value to get_actor")
    raise ValueError(
        f"Failed to look up actor with name '{name}'. This could because 1. You are trying "
        "to look up a named actor you didn't create. 2. The named actor died. 3. You did not "
        "use a namespace matching the namespace of the actor."
    )


def exit_actor():
    raise NotImplementedError(_NOT_YET.format(what="exit_actor()"))
