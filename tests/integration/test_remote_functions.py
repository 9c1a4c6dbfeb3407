"""Remote functions: decorator forms, options, arguments, num_returns, nesting (generators:
``test_generators.py``).

Ray 2.60 behaviour: ray-api-surface.md §2.1, §2.5, §2.6.
"""

from __future__ import annotations

import os
import time

import pytest

import miniray
from miniray import exceptions

GET_TIMEOUT = 30

# A module global read by a module-level remote function: cloudpickle pickles the function by
# reference, so the worker imports this module (the driver's sys.path travels to workers).
MODULE_FACTOR = 7


@miniray.remote
def times_module_factor(x):
    return x * MODULE_FACTOR


def plain_add(a, b):
    return a + b


# ----------------------------------------------------------------------------- decorator forms
def _bare():
    @miniray.remote
    def f(a, b):
        return a + b

    return f


def _with_options():
    @miniray.remote(num_cpus=0.5)
    def f(a, b):
        return a + b

    return f


def _call_form():
    return miniray.remote(plain_add)


def _call_form_with_options():
    return miniray.remote(num_cpus=0.5, max_retries=0)(plain_add)


def _options_method():
    @miniray.remote
    def f(a, b):
        return a + b

    return f.options(num_cpus=0.5, name="renamed")


def _lambda():
    return miniray.remote(lambda a, b: a + b)


@pytest.mark.parametrize(
    "make",
    [_bare, _with_options, _call_form, _call_form_with_options, _options_method, _lambda],
    ids=["bare", "decorator-options", "call-form", "call-form-options", ".options", "lambda"],
)
def test_decorator_forms_run(ray, make):
    f = make()
    assert ray.get(f.remote(2, 3), timeout=GET_TIMEOUT) == 5
    assert ray.get(f.remote(a=2, b=5), timeout=GET_TIMEOUT) == 7
    assert ray.get(f.remote(1, b=1), timeout=GET_TIMEOUT) == 2


def test_remote_function_type(ray):
    from miniray.remote_function import RemoteFunction

    @ray.remote
    def f():
        return 1

    assert isinstance(f, RemoteFunction)
    assert isinstance(ray.remote(plain_add), RemoteFunction)


def test_calling_directly_raises_type_error(ray):
    @ray.remote
    def f():
        return 1

    with pytest.raises(TypeError) as info:
        f()
    message = str(info.value)
    assert message.startswith("Remote functions cannot be called directly. Instead of running")
    assert "f()', try '" in message and "f.remote()'." in message


def test_options_merge_over_decorator_and_are_reused(ray):
    @ray.remote(num_returns=2)
    def pair():
        return 1, 2

    one = pair.options(num_returns=1)
    assert ray.get(one.remote(), timeout=GET_TIMEOUT) == (1, 2)
    refs = pair.remote()
    assert ray.get(refs, timeout=GET_TIMEOUT) == [1, 2]
    # The options wrapper can be called many times.
    assert ray.get([one.remote() for _ in range(3)], timeout=GET_TIMEOUT) == [(1, 2)] * 3


# ----------------------------------------------------------------------------- num_returns
def test_num_returns_two_gives_a_list_of_refs(ray):
    @ray.remote(num_returns=2)
    def two():
        return "a", "b"

    refs = two.remote()
    assert isinstance(refs, list) and len(refs) == 2
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs[1], timeout=GET_TIMEOUT) == "b"
    assert ray.get(refs[0], timeout=GET_TIMEOUT) == "a"


def test_num_returns_zero_gives_none_and_runs(ray, tmp_path):
    marker = tmp_path / "ran"

    @ray.remote(num_returns=0)
    def side_effect(path):
        # Written under another name and renamed, so the marker appears only once complete:
        # the test polls for it while the task may still be writing.
        with open(path + ".tmp", "w") as f:
            f.write("yes")
        os.replace(path + ".tmp", path)

    assert side_effect.remote(str(marker)) is None
    deadline = time.monotonic() + GET_TIMEOUT
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.read_text() == "yes"


@pytest.mark.parametrize(
    "value, cause, text",
    [
        ((1, 2, 3), ValueError, "Task returned 3 objects, but num_returns=2."),
        (
            5,
            TypeError,
            "Task returned int 5, but num_returns=2 expects a sequence of 2 values (e.g. a "
            "tuple). Return 2 values, or use num_returns=1 to return this object as it is.",
        ),
        (None, TypeError, "Task returned NoneType None, but num_returns=2 expects a sequence"),
    ],
    ids=["wrong-count", "not-a-sequence", "none"],
)
def test_num_returns_mismatch_fails_every_ref(ray, value, cause, text):
    """Compared with Ray 2.60: the same types (RayTaskError(ValueError) for a wrong count,
    RayTaskError(TypeError) for a value without a length); Ray's TypeError says only
    "object of type 'int' has no len()", this one what was returned and what was expected."""
    @ray.remote(num_returns=2)
    def bad():
        return value

    refs = bad.remote()
    for ref in refs:
        with pytest.raises(cause) as info:
            ray.get(ref, timeout=GET_TIMEOUT)
        assert isinstance(info.value, exceptions.RayTaskError)
        assert type(info.value).__name__ == f"RayTaskError({cause.__name__})"
        assert text in str(info.value)


# ----------------------------------------------------------------------------- arguments
def test_closure_and_module_global(ray):
    offset = 10
    table = {"k": [1, 2, 3]}

    @ray.remote
    def closure(x):
        return x + offset + sum(table["k"])

    assert ray.get(closure.remote(1), timeout=GET_TIMEOUT) == 17
    assert ray.get(times_module_factor.remote(3), timeout=GET_TIMEOUT) == 21


def test_local_class_instances_travel_by_value(ray):
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

        def norm1(self):
            return abs(self.x) + abs(self.y)

    @ray.remote
    def move(p):
        return Point(p.x + 1, p.y - 1)

    moved = ray.get(move.remote(Point(1, 2)), timeout=GET_TIMEOUT)
    assert (moved.x, moved.y, moved.norm1()) == (2, 1, 3)


def test_kwargs_and_defaults(ray):
    @ray.remote
    def f(a, b=2, *rest, c=3, **extra):
        return a, b, rest, c, extra

    assert ray.get(f.remote(1), timeout=GET_TIMEOUT) == (1, 2, (), 3, {})
    assert ray.get(f.remote(1, 5, 6, 7, c=8, d=9), timeout=GET_TIMEOUT) == (
        1,
        5,
        (6, 7),
        8,
        {"d": 9},
    )


@pytest.mark.parametrize(
    "args, kwargs, text",
    [
        ((1, 2, 3, 4), {}, "too many positional arguments"),
        ((), {}, "missing a required argument: 'a'"),
        ((1,), {"c": 3, "a": 1}, "multiple values for argument 'a'"),
        ((1,), {}, "missing a required argument: 'c'"),
        ((1,), {"c": 3, "zz": 1}, "got an unexpected keyword argument 'zz'"),
    ],
    ids=["too-many", "missing", "twice", "keyword-only", "unexpected"],
)
def test_bad_call_raises_type_error_at_remote(ray, args, kwargs, text):
    """Compared with Ray 2.60: ``.remote()`` binds the arguments to the signature and raises
    TypeError at once (not a RayTaskError from the worker), with bind's text; miniray adds
    the call and the signature. ``.options().remote()`` checks the same."""

    @ray.remote
    def f(a, b=2, *, c):
        return a

    for call in (f.remote, f.options(num_cpus=0.5).remote):
        with pytest.raises(TypeError) as info:
            call(*args, **kwargs)
        assert type(info.value) is TypeError
        assert str(info.value) == (
            f"f.remote() got invalid arguments: {text}. The signature is f(a, b=2, *, c)."
        )
    assert ray.get(f.remote(1, c=3), timeout=GET_TIMEOUT) == 1


def test_signature_check_respects_positional_only_and_var_args(ray):
    @ray.remote
    def g(a, /, b, *rest, **extra):
        return a, b, rest, extra

    assert ray.get(g.remote(1, 2, 3, k=4), timeout=GET_TIMEOUT) == (1, 2, (3,), {"k": 4})
    # inspect's words (3.13 changed them); before the fix, 3.13 let this call through
    with pytest.raises(TypeError, match="'a' parameter is positional only|"
                                        "positional-only arguments passed as keyword"):
        g.remote(a=1, b=2)

    @ray.remote
    def nested(x):
        try:
            g.remote()
        except TypeError as error:  # checked inside a worker too
            return f"{x}: {error}"

    assert ray.get(nested.remote(1), timeout=GET_TIMEOUT) == (
        "1: g.remote() got invalid arguments: missing a required argument: 'a'. "
        "The signature is g(a, /, b, *rest, **extra)."
    )


def test_top_level_refs_are_resolved(ray):
    @ray.remote
    def describe(x, y=None):
        return type(x).__name__, x, type(y).__name__, y

    @ray.remote
    def produce():
        return [1, 2]

    put_ref = ray.put(10)
    task_ref = produce.remote()
    assert ray.get(describe.remote(put_ref, y=task_ref), timeout=GET_TIMEOUT) == (
        "int",
        10,
        "list",
        [1, 2],
    )


def test_nested_refs_are_passed_as_refs(ray):
    @ray.remote
    def inner(refs, mapping):
        import miniray as inner_ray

        assert all(isinstance(r, inner_ray.ObjectRef) for r in refs)
        assert isinstance(mapping["r"], inner_ray.ObjectRef)
        return inner_ray.get(refs) + [inner_ray.get(mapping["r"])]

    @ray.remote
    def slow_value():
        time.sleep(0.2)
        return "late"

    refs = [ray.put("a"), slow_value.remote()]
    assert ray.get(inner.remote(refs, {"r": ray.put("b")}), timeout=GET_TIMEOUT) == [
        "a",
        "late",
        "b",
    ]


def test_chained_tasks(ray):
    @ray.remote
    def inc(x):
        return x + 1

    ref = ray.put(0)
    for _ in range(10):
        ref = inc.remote(ref)
    assert ray.get(ref, timeout=GET_TIMEOUT) == 10


def test_large_arguments_and_results(ray):
    @ray.remote
    def echo_len(data):
        return len(data), data[-3:]

    blob = os.urandom(8 << 20)
    assert ray.get(echo_len.remote(blob), timeout=GET_TIMEOUT) == (len(blob), blob[-3:])


# ----------------------------------------------------------------------------- nesting
def test_nested_tasks_do_not_deadlock(ray_start):
    ray_start(num_cpus=2)

    @miniray.remote
    def child(i):
        time.sleep(0.05)
        return i * i

    @miniray.remote
    def parent(n):
        import miniray as inner

        refs = [child.remote(n * 10 + k) for k in range(3)]
        return sum(inner.get(refs, timeout=60))

    # 4 parents on 2 CPUs, each blocked in get() on its children: a worker blocked in get()
    # gives its CPU back, so the children run.
    parents = [parent.remote(n) for n in range(4)]
    expected = [sum((n * 10 + k) ** 2 for k in range(3)) for n in range(4)]
    assert miniray.get(parents, timeout=60) == expected


def test_nested_wait_and_put_inside_a_task(ray):
    @ray.remote
    def child(x):
        return x + 1

    @ray.remote
    def parent():
        import miniray as inner

        refs = [child.remote(inner.put(i)) for i in range(3)]
        ready, rest = inner.wait(refs, num_returns=3, timeout=60)
        assert rest == [] and len(ready) == 3
        return inner.get(refs)

    assert ray.get(parent.remote(), timeout=60) == [1, 2, 3]


# ----------------------------------------------------------------------------- no main guard
NO_MAIN_GUARD = """
    import os
    import miniray as ray

    ray.init(num_cpus=2)
    FACTOR = 3

    def helper(x):
        return x * FACTOR

    class Box:
        def __init__(self, v):
            self.v = v

    @ray.remote
    def work(box):
        return Box(helper(box.v)), os.getpid()

    results = ray.get([work.remote(Box(i)) for i in range(4)])
    print("values", [b.v for b, _ in results])
    print("driver-is-worker", os.getpid() in {pid for _, pid in results})
    ray.shutdown()
"""


def test_script_without_main_guard_runs_tasks(drivers):
    result = drivers.run(NO_MAIN_GUARD, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "values [0, 3, 6, 9]" in result.stdout
    assert "driver-is-worker False" in result.stdout


def test_more_blocked_parents_than_worker_cap_do_not_deadlock(ray_start):
    # Regression: workers blocked in get() used to count against the worker cap (8 here), so
    # the 9th parent's child never got a worker.
    ray_start(num_cpus=2)

    @miniray.remote
    def child(i):
        return i

    @miniray.remote
    def parent(i):
        import miniray as inner

        return inner.get(child.remote(i), timeout=60)

    # Bounds for a deadlock, not a speed: eleven workers start here, slowly on a loaded runner.
    assert miniray.get([parent.remote(i) for i in range(10)], timeout=90) == list(range(10))


# ----------------------------------------------------------------------------- function names
def test_function_names_have_no_locals_segment(ray):
    """``get_task_function_name()`` is ``<module>.<name>`` for a function or actor class
    defined inside a function (``__name__``, not ``__qualname__``), and the direct-call error
    names ``<module>.<name>`` too. Compared with Ray 2.60 (``pkg.mod.nested``,
    ``pkg.mod.Class.method``)."""

    def make():
        @ray.remote
        def nested():
            return ray.get_runtime_context().get_task_function_name()

        @ray.remote
        class Local:
            def name(self):
                return ray.get_runtime_context().get_task_function_name()

        return nested, Local

    nested, Local = make()
    assert ray.get(nested.remote(), timeout=GET_TIMEOUT) == f"{__name__}.nested"
    assert ray.get(nested.options(name="x").remote(), timeout=GET_TIMEOUT) == f"{__name__}.nested"
    actor = Local.remote()
    assert ray.get(actor.name.remote(), timeout=GET_TIMEOUT) == f"{__name__}.Local.name"
    with pytest.raises(TypeError, match=rf"'{__name__}\.nested\(\)'"):
        nested()
    ray.kill(actor)


FUNCTION_NAMES = """
import miniray as ray

def make():
    @ray.remote
    def nested():
        return ray.get_runtime_context().get_task_function_name()

    @ray.remote
    class Local:
        def name(self):
            return ray.get_runtime_context().get_task_function_name()

    return nested, Local

ray.init(num_cpus=1)
nested, Local = make()
lam = ray.remote(lambda: ray.get_runtime_context().get_task_function_name())
actor = Local.remote()
print("names", ray.get(nested.remote()), ray.get(actor.name.remote()), ray.get(lam.remote()))
try:
    nested()
except TypeError as error:
    print("direct", error)
ray.kill(actor)
ray.shutdown()
"""


def test_function_names_of_a_script_are_named_after_its_file(drivers):
    """A function of the driver script (module ``__main__``) is named after the script's
    file, as Ray 2.60 names it (``app.nested``, ``app.Local.name``, ``app.<lambda>`` for
    ``python app.py``); the direct-call error still says ``__main__.nested``, as Ray's."""
    result = drivers.run(FUNCTION_NAMES, timeout=60)
    assert result.returncode == 0, result.stderr
    stem = os.path.splitext(os.path.basename(result.args[-1]))[0]
    assert f"names {stem}.nested {stem}.Local.name {stem}.<lambda>\n" in result.stdout
    assert "Instead of running '__main__.nested()'" in result.stdout


def test_the_lower_level_remote_forms_of_functions_actors_and_methods(ray_start):
    """``_remote(args=..., kwargs=..., **options)``, which Ray's own tests and older programs
    call (its test_submit_api; each line compared with Ray 2.60)."""
    ray_start(num_cpus=2, resources={"Custom": 1})

    @miniray.remote
    def upto(n):
        return list(range(n))

    @miniray.remote
    def add(a, b=2):
        return a + b

    @miniray.remote
    class Base:
        def __init__(self, x, y=0):
            self.v = x + y

        def spread(self, n):
            return [self.v + i for i in range(n)]

        def plus(self, k=0):
            return self.v + k

    assert miniray.get(upto._remote(args=[2], num_returns=1), timeout=GET_TIMEOUT) == [0, 1]
    assert miniray.get(upto._remote(args=[2], num_returns=2), timeout=GET_TIMEOUT) == [0, 1]
    assert miniray.get(add._remote(args=[1], kwargs={"b": 5}), timeout=GET_TIMEOUT) == 6
    actor = Base._remote(args=[1], kwargs={"y": 2}, num_cpus=0, resources={"Custom": 1})
    assert miniray.get(actor.plus._remote(kwargs={"k": 1}), timeout=GET_TIMEOUT) == 4
    assert miniray.get(actor.spread._remote(args=[2], num_returns=2),
                       timeout=GET_TIMEOUT) == [3, 4]
    assert miniray.get(actor.plus._remote(), timeout=GET_TIMEOUT) == 3
    assert miniray.available_resources().get("Custom", 0) == 0  # the actor holds it


def test_a_function_or_actor_capturing_too_much_is_refused_at_its_first_call(ray):
    big = bytearray(101 * 10**6)

    @ray.remote
    def f():
        return len(big)

    @ray.remote
    class Holder:
        def size(self):
            return len(big)

    with pytest.raises(ValueError, match=r"The remote function .*\.f is too large \(96 MiB > "
                                         r"FUNCTION_SIZE_ERROR_THRESHOLD=95 MiB\)"):
        f.remote()
    with pytest.raises(ValueError, match=r"The actor Holder is too large"):
        Holder.remote()

    @ray.remote
    def small():
        return 1

    assert ray.get(small.remote(), timeout=GET_TIMEOUT) == 1
