"""The actor manager (with its mixins) and the actor-service link use their owner only
through ``actors.ActorsOwner``: every attribute they read of it is declared there, none is
private, and the owner has each one. A new reach into the owner fails here until it is declared."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from miniray._private.owner import actors
from miniray._private.owner.owner import Owner

OWNER_DIR = Path(actors.__file__).parent


def _used_of_owner(path: Path) -> set[str]:
    """Attributes read of ``owner`` or ``self.owner`` in a module."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id == "owner":
            used.add(node.attr)
        elif (isinstance(value, ast.Attribute) and value.attr == "owner"
              and isinstance(value.value, ast.Name) and value.value.id == "self"):
            used.add(node.attr)
    return used


def _declared() -> set[str]:
    members = set(getattr(actors.ActorsOwner, "__annotations__", {}))
    members |= {name for name, _ in inspect.getmembers(actors.ActorsOwner, inspect.isfunction)}
    return {name for name in members if not name.startswith("__")}


def _owner_has() -> set[str]:
    """What an Owner has: its class's members and what its __init__ assigns to self."""
    has = set(dir(Owner))
    for node in ast.walk(ast.parse(inspect.getsource(Owner.__init__).strip())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
            has.add(node.attr)
    return has


def test_the_actor_modules_use_only_what_the_seam_declares():
    declared = _declared()
    for name in ("actors.py", "actor_calls.py", "actor_handles.py", "actor_service_proxies.py",
                 "actor_link.py"):
        used = _used_of_owner(OWNER_DIR / name)
        assert used, f"{name}: found no use of the owner (the test would prove nothing)"
        assert not {u for u in used if u.startswith("_")}, f"{name} reads private state"
        assert used <= declared, f"{name} uses undeclared {sorted(used - declared)}"


def test_the_owner_provides_the_whole_seam():
    missing = _declared() - _owner_has()
    assert not missing, f"Owner lacks {sorted(missing)}"


def test_the_check_finds_an_undeclared_use(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(self):\n    return self.owner.tasks, owner._lock\n")
    assert _used_of_owner(module) == {"tasks", "_lock"}
