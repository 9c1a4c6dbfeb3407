"""Ray 2.60's public names, each looked up in miniray: works, refused with a reason, or missing.

Owns: classifying one name (``classify``), the written verdicts for every name that does not
simply work (``REFUSED``, ``MISSING``, each with its reason), and the README table built from
both (``table``). Does not own: the list of names, which ``collect_ray_names.py`` writes from
Ray's own package into ``ray_2_60_names.json``. Called by ``test_ray_surface.py``, and by
``python -m compat_tests.ray_surface`` to print the README table.

How a name is classified, without running a cluster::

    library ("ray.data")   import miniray.data  ── ImportError naming Ray Core ──► refused
    name ("ray.util.x")    import miniray.util, getattr x ── missing ──────────► missing
                             │ found
                             ├─ a function (or a class whose __init__, or a property whose
                             │  getter) does nothing but raise NotImplementedError ► refused
                             └─ otherwise ───────────────────────────────────────► works

The refusal check reads the source: a stub that only raises cannot pass as "works". What a
working name does is tested where it is built (tests/); this file proves that nothing is
missing or refused without a reason written here and shown in the README.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import textwrap
import warnings
from typing import Any

NAMES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_2_60_names.json")

WORKS, REFUSED_, MISSING_ = "works", "refused", "missing"

# Names miniray refuses on purpose: calling or importing them raises an error that says so.
# Key: "module:name" ("ray.data:" for a library, "module:*" for every name of a module).
# Value: the reason, shown in the README.
_LIBRARY = "a Ray library, not Ray Core: importing it says to run the program on Ray"
_CLIENT = "Ray Client: connect with `init(address=...)` on the node's host instead"
_JAVA = "cross-language (Java) workers; a miniray node runs Python workers only"
_AS_RAY = "Ray 2.60 raises `NotImplementedError` for it too"
_DEBUGGER = "Ray's distributed debugger (`ray debug`); not provided"
_TQDM_INTERNAL = "internal to Ray's bar protocol (its marker, its driver-side singleton)"
_COMPILED = ("Ray's compiled graphs; `dag.execute()` runs the same DAG by submitting its tasks "
             "and actor calls")
REFUSED: dict[str, str] = {
    "ray.data:": _LIBRARY,
    "ray.train:": _LIBRARY,
    "ray.tune:": _LIBRARY,
    "ray.serve:": _LIBRARY,
    "ray.rllib:": _LIBRARY,
    "ray.workflow:": _LIBRARY,
    "ray.autoscaler:": "Ray's cluster autoscaler; a miniray node is one host",
    "ray.util.state:list_cluster_events": "miniray keeps no event history; `list_tasks` and "
                                          "`list_actors` show the current state",
    "ray.util.state:list_runtime_envs": "runtime environments are set up in each worker at "
                                        "its start; `list_tasks(detail=True)` shows what runs",
    "ray.util.state:StateApiClient": "Ray's HTTP client of the dashboard's state server; call "
                                     "the module's functions (`list_tasks`, ...) instead",
    "ray.job_submission:": "Ray's job server; run the script with `miniray run` instead",
    "ray.util.collective:": "Ray's collective-communication library (NCCL/gloo groups)",
    # Ray Client proxies a driver to a remote cluster over gRPC; a miniray driver runs on the
    # node's host.
    "ray:client": _CLIENT,
    "ray:ClientBuilder": _CLIENT,
    "ray.util:connect": _CLIENT,
    "ray.util:disconnect": _CLIENT,
    "ray:java_function": _JAVA,
    "ray:java_actor_class": _JAVA,
    "ray:ObjectRefGenerator.send": _AS_RAY,
    "ray:ObjectRefGenerator.throw": _AS_RAY,
    "ray:ObjectRefGenerator.close": _AS_RAY,
    "ray:ObjectRefGenerator.asend": _AS_RAY,
    "ray:ObjectRefGenerator.athrow": _AS_RAY,
    "ray:ObjectRefGenerator.aclose": _AS_RAY,
    "ray.dag:CollectiveOutputNode": _COMPILED,
    "ray.dag:DAGContext": _COMPILED,
    "ray.dag:DAGOperationFuture": _COMPILED,
    "ray.dag:GPUFuture": _COMPILED,
    "ray.dag:plot": "drawing a DAG needs pydot and graphviz; `print(dag)` shows it as text",
}

# Names miniray does not have. Value: why, shown in the README.
_NOT_IN_RAY = "listed in Ray 2.60's `__all__`, but Ray has no such attribute either"
MISSING: dict[str, str] = {
    "ray:_config": "Ray's raylet configuration object (internal); miniray has no raylet",
    "ray:cpp_function": _NOT_IN_RAY,
    "ray:widgets": "Jupyter display helpers for Ray's own objects; programs do not call them",
    "ray.util:iter": "Ray's deprecated parallel iterators (`ray.util.iter`); use tasks, "
                     "`ActorPool` or `ray.util.multiprocessing.Pool`",
    "ray.util:pdb": _DEBUGGER,
    "ray.util:ray_debugpy": _DEBUGGER,
    "ray.util.accelerators:NVIDIA_A100_40G": _NOT_IN_RAY,
    "ray.util.accelerators:NVIDIA_A100_80G": _NOT_IN_RAY,
    "ray.experimental.tqdm_ray:RAY_TQDM_MAGIC": _TQDM_INTERNAL,
    "ray.experimental.tqdm_ray:instance": _TQDM_INTERNAL,
    "ray.experimental.tqdm_ray:real_tqdm": "the `tqdm` package as Ray imports it, if installed; "
                                           "miniray's bars do not need it",
}


def key(row: dict) -> str:
    return f"{row['module']}:{row['name']}"


def load_names() -> list[dict]:
    with open(NAMES_FILE) as f:
        return json.load(f)["names"]


def miniray_module(ray_module: str) -> str:
    return "miniray" + ray_module[len("ray"):]


def _only_raises_not_implemented(func: Any) -> bool:
    """True when ``func``'s body (its docstring aside) is a single ``raise NotImplementedError``."""
    func = inspect.unwrap(func)
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source)
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = list(tree.body[0].body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(name, ast.Name) and name.id == "NotImplementedError"


def _is_refusal_stub(obj: Any) -> bool:
    if isinstance(obj, property):
        return obj.fget is not None and _only_raises_not_implemented(obj.fget)
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        return init is not None and _only_raises_not_implemented(init)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return _only_raises_not_implemented(obj)
    return False


def _lookup(module: str, dotted: str) -> Any:
    """``getattr`` along ``dotted`` ("Class.member") in miniray's ``module``; raises
    ImportError or AttributeError when something on the way is not there. Class members are
    read from the class ``__dict__`` chain so properties stay properties."""
    obj: Any = importlib.import_module(miniray_module(module))
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if inspect.isclass(obj) and i == len(parts) - 1:
            for klass in obj.__mro__:
                if part in klass.__dict__:
                    found = klass.__dict__[part]
                    return found.__func__ if isinstance(found, (staticmethod, classmethod)) \
                        else found
            if part in getattr(obj, "__slots__", ()):
                return None
            return _instance_member(obj, part)
        obj = getattr(obj, part)
    return obj


# Members miniray sets on each instance (as Ray's RemoteFunction does for ``remote``).
_INSTANCE_MEMBERS = {("RemoteFunction", "remote")}


def _instance_member(cls: type, part: str) -> Any:
    if (cls.__name__, part) in _INSTANCE_MEMBERS:
        source = inspect.getsource(cls)
        if f"self.{part} =" in source:
            return None
    raise AttributeError(f"{cls.__name__}.{part}")


def classify(row: dict) -> tuple[str, str]:
    """(verdict, detail) for one row of ``ray_2_60_names.json``."""
    with warnings.catch_warnings():  # deprecated names still resolve; their warning is noise
        warnings.simplefilter("ignore")
        return _classify(row)


def _classify(row: dict) -> tuple[str, str]:
    if row["kind"] == "library":
        try:
            importlib.import_module(miniray_module(row["module"]))
        except ImportError as error:
            text = str(error)
            if "covers Ray Core" in text:
                return REFUSED_, text
            return MISSING_, text
        return WORKS, ""
    try:
        obj = _lookup(row["module"], row["name"])
    except ImportError as error:
        if "covers Ray Core" in str(error):
            return REFUSED_, str(error)
        return MISSING_, f"ImportError: {error}"
    except AttributeError as error:
        return MISSING_, f"AttributeError: {error}"
    if inspect.ismodule(obj) and not row.get("is_module", False):
        return MISSING_, f"a module where Ray has a function, class or value: {obj.__name__}"
    if _is_refusal_stub(obj):
        return REFUSED_, "raises NotImplementedError"
    return WORKS, ""


def verdict_key(row: dict) -> str | None:
    """The key of ``row``'s written verdict (its own, else its module's ``"module:*"``)."""
    for k in (key(row), f"{row['module']}:*"):
        if k in REFUSED or k in MISSING:
            return k
    return None


def expected(row: dict) -> str:
    k = verdict_key(row)
    if k is None:
        return WORKS
    return REFUSED_ if k in REFUSED else MISSING_


def table(rows: list[dict] | None = None) -> str:
    """The README's table: counts per module, then every refused or missing name with its
    reason."""
    rows = load_names() if rows is None else rows
    per_module: dict[str, dict[str, int]] = {}
    for row in rows:
        counts = per_module.setdefault(row["module"], {WORKS: 0, REFUSED_: 0, MISSING_: 0})
        counts[expected(row)] += 1
    total = {v: sum(c[v] for c in per_module.values()) for v in (WORKS, REFUSED_, MISSING_)}
    lines = ["| Ray 2.60 module | names | work | refused | missing |",
             "|---|---:|---:|---:|---:|"]
    for module, c in per_module.items():
        lines.append(f"| `{module}` | {sum(c.values())} | {c[WORKS]} | {c[REFUSED_]} | "
                     f"{c[MISSING_]} |")
    lines.append(f"| **all** | **{len(rows)}** | **{total[WORKS]}** | **{total[REFUSED_]}** | "
                 f"**{total[MISSING_]}** |")
    lines += ["", "| name | in miniray | why |", "|---|---|---|"]
    shown_keys: set = set()
    for row in rows:
        k = verdict_key(row)
        if k is None or k in shown_keys:
            continue
        shown_keys.add(k)
        verdict = expected(row)
        reason = (REFUSED if verdict == REFUSED_ else MISSING)[k]
        module, name = k.split(":")
        shown = f"{module}.{name}" if name else module
        lines.append(f"| `{shown}` | {verdict} | {reason} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
