"""Serialization of values, functions and errors.

Owns: how a Python value becomes bytes and back (cloudpickle, pickle protocol 5), and the
translation of pickling failures into clear errors: Ray's first line ("Could not serialize
the argument <value> for a task or actor <module.name>:", "... the function ...", "... the
actor class ...", "... the put value ...", ``__main__`` named by the script's file as Ray
names it), then ``inspect_serializability``'s report on the culprit (``serializability``),
then what to do. Does not own: where bytes are kept (``object_store.py``).
Called by: remote_function.py and actor.py (arguments), worker_main.py (arguments, results), the
owner (put).

Values go through cloudpickle so closures, lambdas and classes defined in ``__main__`` travel by
value; plain data takes pickle's C fast path inside cloudpickle. A remote function or class
(``dumps_function``, once per export) goes through cloudpickle's pickler with three changes
that keep its bytes or meaning: its code keeps the file it was defined in, the global names
it uses are read from its raw bytecode (``code_global_names``) instead of by cloudpickle's
``dis`` walk, and cloudpickle's own helpers are known to go by reference (a new two-line
function: 69 -> 36 µs).
"""

from __future__ import annotations

import copyreg
import dis
import functools
import io
import logging
import pickle
import sys
import threading
import types
from collections import ChainMap
from typing import Any

import cloudpickle

from miniray._private.core import config, oob, serializability

PROTOCOL = 5

# Refs pickled while a collector is active are *contained* in what is being serialized (a put
# value, a call's arguments): the owner holds them for as long as that container lives instead
# of keeping them forever (see owner/object_table.py). Thread-local, so concurrent serializations
# never mix.
_collecting = threading.local()


def start_collecting() -> None:
    _collecting.ids = []


def stop_collecting() -> list:
    ids = getattr(_collecting, "ids", None)
    _collecting.ids = None
    return ids or []


def collected_ids() -> list | None:
    """The list the current thread's collector appends to, or None when none is active."""
    return getattr(_collecting, "ids", None)


# Classes given a serializer by ``register_serializer``. The reducer goes into copyreg's
# dispatch table, which both pickle's C pickler and cloudpickle consult, so values of other
# types pay nothing. The deserializer travels inside the pickle (by value when cloudpickle
# must), so a process that never registered the class can still load it, as in Ray.
_custom_serializers: dict = {}


def register_serializer(cls: type, serializer: Any, deserializer: Any) -> None:
    """Pickle instances of exactly ``cls`` as ``deserializer(serializer(obj))``."""
    if not isinstance(cls, type):
        raise TypeError(f"register_serializer expects a class, got {cls!r}.")
    if not callable(serializer) or not callable(deserializer):
        raise TypeError("register_serializer needs callable serializer= and deserializer=.")

    def reduce_custom(obj: Any) -> tuple:
        return deserializer, (serializer(obj),)

    _from_driver.discard(cls)  # the caller's own from now on (apply_registrations re-adds)
    _custom_serializers[cls] = (serializer, deserializer)
    copyreg.dispatch_table[cls] = reduce_custom


def deregister_serializer(cls: type) -> None:
    """Forget ``cls``' custom serializer; ``cls`` pickles as usual again."""
    _from_driver.discard(cls)
    if _custom_serializers.pop(cls, None) is not None:
        copyreg.dispatch_table.pop(cls, None)


# The classes whose serializer came from the driver's registrations (``apply_registrations``),
# apart from those this process registered itself, which the driver's changes leave alone.
_from_driver: set = set()


def has_custom_serializers() -> bool:
    return bool(_custom_serializers)


def registrations_blob() -> bytes:
    """This process's registrations, pickled for its session's workers."""
    items = [(cls, pair[0], pair[1]) for cls, pair in _custom_serializers.items()]
    return cloudpickle.dumps(items, protocol=PROTOCOL)


def apply_registrations(blob: bytes) -> None:
    """Take the driver's registrations (``registrations_blob``): register what is new, forget
    what the driver deregistered."""
    items = pickle.loads(blob)
    wanted = {cls for cls, _, _ in items}
    for cls in _from_driver - wanted:
        deregister_serializer(cls)
    for cls, serializer, deserializer in items:
        if cls in _custom_serializers and cls not in _from_driver:
            continue  # registered by this process itself: its own choice wins
        register_serializer(cls, serializer, deserializer)
        _from_driver.add(cls)


def dumps(value: Any) -> bytes:
    return cloudpickle.dumps(value, protocol=PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def _pickle_arguments(args: tuple, kwargs: dict, function_name: str) -> tuple[bytes, list]:
    """``(metadata, buffers)``: the call's pickle with its buffers (numpy arrays) kept out of
    band as flat byte views, nothing copied yet; or TypeError naming what could not be
    pickled."""
    buffers: list = []
    try:
        # A callback that returns None keeps each buffer out of band; no Serialized (and
        # no segment layout) is built for the blob itself.
        metadata = cloudpickle.dumps((args, kwargs), protocol=PROTOCOL,
                                     buffer_callback=buffers.append)
        return metadata, [buffer.raw() for buffer in buffers]
    except Exception as error:
        culprit = _find_unpicklable(list(args) + list(kwargs.values()))
        what = "argument" if culprit is not None else "arguments"
        raise TypeError(unpicklable_message(
            what, (args, kwargs) if culprit is None else culprit, error,
            "Arguments of remote calls must be picklable (cloudpickle); pass the data needed "
            "to rebuild the object instead, or create it inside the task.",
            f"for a task or actor {display_name(function_name)}")) from error


def dumps_arguments(args: tuple, kwargs: dict, function_name: str) -> bytes:
    """Pickle a call's arguments, or raise TypeError naming what could not be pickled.

    Buffers (numpy arrays) are kept out of band in the blob (``oob.inline_blob``), so
    ``loads_arguments`` hands the task read-only views of them, as Ray does for every array
    passed by value, whatever its size; a plain pickle when there are none."""
    return oob.join_inline(*_pickle_arguments(args, kwargs, function_name))


def loads_arguments(blob: bytes) -> tuple:
    """``(args, kwargs)`` from ``dumps_arguments``' blob; arrays are read-only views of it."""
    return oob.loads_inline(blob)


_NO_ARGS_BLOB = pickle.dumps(((), {}), protocol=PROTOCOL)
# Values whose pickle is always small: never worth a separate pass to measure them.
_SMALL_TYPES = frozenset((type(None), bool, int, float, complex))


def pack_arguments(args: tuple, kwargs: dict, function_name: str, ref_type: type,
                   large=None):
    """``(blob, deps, contained, stored)``: the pickled call; the top-level ObjectRef
    arguments taken out of it as ``[(position or keyword, object_id)]`` (resolved before the
    call); the ids of refs nested in containers, which travel as refs (the owner holds those
    objects until the call is done; a worker that keeps such a ref reports it as a
    borrower); and the refs of arguments that were put in the store.

    ``large``: ``(threshold, put)`` of the caller's runtime, or None. As in Ray, an argument
    passed by value whose serialized size reaches ``threshold`` is stored once with
    ``put(serialized, contained ids) -> object id`` and passed as a ref, so the call message
    stays small and the task maps the value without a copy. The caller keeps ``stored``
    alive until the call is submitted; from then on the pending call holds those objects,
    and they are freed once it is done (finished, failed or cancelled; retries reuse them).
    """
    if not args and not kwargs:
        return _NO_ARGS_BLOB, None, (), ()
    deps = []
    if any(type(a) is ref_type for a in args):
        args = list(args)
        for index, value in enumerate(args):
            if type(value) is ref_type:
                deps.append((index, value._id))
                args[index] = None
        args = tuple(args)
    if any(type(v) is ref_type for v in kwargs.values()):
        kwargs = dict(kwargs)
        for key, value in kwargs.items():
            if type(value) is ref_type:
                deps.append((key, value._id))
                kwargs[key] = None
    start_collecting()
    try:
        metadata, buffers = _pickle_arguments(args, kwargs, function_name)
    finally:
        contained = stop_collecting()
    stored: tuple = ()
    # Only a call whose whole pickle reaches the threshold can hold a large argument, so
    # small calls pay nothing more than the sum below.
    if large is not None and len(metadata) + sum(b.nbytes for b in buffers) >= large[0]:
        args, kwargs, stored = _store_large(args, kwargs, deps, large, ref_type)
        if stored:
            start_collecting()
            try:
                metadata, buffers = _pickle_arguments(args, kwargs, function_name)
            finally:
                contained = stop_collecting()
    return oob.join_inline(metadata, buffers), deps or None, tuple(contained), stored


def _store_large(args: tuple, kwargs: dict, deps: list, large, ref_type: type):
    """Put each argument at or above the threshold (``large``) in the store; returns the
    arguments with ``None`` in their place, and their refs (``deps`` gets their ids)."""
    threshold, put = large
    stored = []
    new_args = list(args)
    new_kwargs = dict(kwargs)
    places = [(i, v) for i, v in enumerate(args)] + list(kwargs.items())
    for place, value in places:
        if type(value) in _SMALL_TYPES:  # a ref argument's place holds None by now
            continue
        start_collecting()  # refs inside this argument: the stored object holds them
        try:
            ser = oob.serialize(value)
        finally:
            inner = stop_collecting()
        if ser.total_size < threshold:
            continue
        ref = ref_type(put(ser, tuple(inner)))
        stored.append(ref)
        deps.append((place, ref._id))
        if isinstance(place, int):
            new_args[place] = None
        else:
            new_kwargs[place] = None
    if not stored:
        return args, kwargs, ()
    return tuple(new_args), new_kwargs, tuple(stored)


# cloudpickle 3.1.3 and later write every code object it pickles by value with the file name
# "<dynamic-code>" (a payload that does not depend on where it was made). A function then
# loses its file in the worker: a task's traceback has no source lines, and a method of a
# class from the driver's script is no longer named after the script, unlike Ray 2.60 (its
# own copy of cloudpickle keeps the file). Functions and classes are pickled once per export,
# so they keep it; values (arguments, results, puts) keep cloudpickle's payload.
_DYNAMIC_FILE = "<dynamic-code>"
_cp_module = getattr(cloudpickle, "cloudpickle", None)
_CloudPickler = getattr(cloudpickle, "Pickler", None) or cloudpickle.CloudPickler
_reduce_code = _CloudPickler.dispatch_table[types.CodeType]


def _reduce_code_keeping_file(code: types.CodeType):
    constructor, args = _reduce_code(code)
    if _DYNAMIC_FILE not in args:
        return constructor, args
    return constructor, tuple(
        code.co_filename if isinstance(arg, str) and arg == _DYNAMIC_FILE else arg
        for arg in args)


# cloudpickle's own helpers, which every function by value names (``_make_function``,
# ``_builtin_type``, ``_function_setstate``, ...): cloudpickle decides for each that it goes
# by reference after looking it up in its module (~4 µs each); here they are known. Only
# while no module is registered to go by value (cloudpickle's own could be).
_HELPERS = frozenset(
    value for name, value in vars(_cp_module or cloudpickle).items()
    if isinstance(value, types.FunctionType) and name.startswith("_")
    and getattr(value, "__module__", None) == getattr(_cp_module, "__name__", None)
    and getattr(value, "__qualname__", None) == name)
_BY_VALUE_MODULES = getattr(_cp_module, "_PICKLE_BY_VALUE_MODULES", None)
if not hasattr(_CloudPickler, "reducer_override"):  # a cloudpickle without it: no shortcut
    _BY_VALUE_MODULES = None
_FUNCTION = types.FunctionType


class _FunctionPickler(_CloudPickler):
    """cloudpickle's pickler, except that code keeps the file it was defined in, and
    cloudpickle's helpers are known to go by reference."""

    dispatch_table = ChainMap({types.CodeType: _reduce_code_keeping_file},
                              _CloudPickler.dispatch_table)

    if _BY_VALUE_MODULES is not None:

        def reducer_override(self, obj):
            if type(obj) is _FUNCTION and obj in _HELPERS and not _BY_VALUE_MODULES:
                return NotImplemented  # pickled as a global, as cloudpickle decides
            return super().reducer_override(obj)


# cloudpickle finds the globals a function by value needs (``_extract_code_globals``) with
# ``dis.get_instructions``, which builds an Instruction for every opcode: ~25 µs for a
# two-line function, a third of pickling it. The same names are read here from the raw
# bytecode (``co_code`` is the unspecialised form, its inline caches zeros) and put in
# cloudpickle's own cache, which it consults first; the names and their order are the ones
# it would find (tests/unit/test_function_pickles.py compares them over the standard
# library). Where this cloudpickle has no such cache, it finds them itself.
_globals_cache = getattr(_cp_module, "_extract_code_globals_cache", None)
_GLOBAL_OPS = frozenset(getattr(_cp_module, "GLOBAL_OPS", ()))
_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
_EXTENDED_ARG = dis.EXTENDED_ARG
# From 3.11, LOAD_GLOBAL's argument is the name's index shifted left by one (the low bit
# says whether a NULL is pushed too).
_LOAD_GLOBAL_SHIFT = 1 if sys.version_info >= (3, 11) else 0


def code_global_names(code: types.CodeType) -> dict:
    """The global names ``code`` and the code nested in it read, write or delete, as a
    dict of None values in first-use order (cloudpickle's ``_extract_code_globals``)."""
    names = code.co_names
    found: dict = {}
    raw = code.co_code
    extended = 0
    for i in range(0, len(raw), 2):
        op = raw[i]
        arg = raw[i + 1] | extended
        if op == _EXTENDED_ARG:
            extended = arg << 8
            continue
        extended = 0
        if op in _GLOBAL_OPS:
            found[names[arg >> _LOAD_GLOBAL_SHIFT if op == _LOAD_GLOBAL else arg]] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.update(code_global_names(const))
    return found


def _note_global_names(function: Any) -> None:
    """Fill cloudpickle's cache of global names for ``function`` (or the functions a
    ``functools.partial`` holds) before it is pickled by value."""
    if _globals_cache is None or not _GLOBAL_OPS:
        return
    if isinstance(function, functools.partial):
        targets = [function.func, *function.args]
    else:
        targets = [function]
    for target in targets:
        if isinstance(target, types.FunctionType):
            code = target.__code__
            if code not in _globals_cache:
                _globals_cache[code] = code_global_names(code)


def _dumps_keeping_files(function: Any) -> bytes:
    _note_global_names(function)
    buffer = io.BytesIO()
    _FunctionPickler(buffer, protocol=PROTOCOL).dump(function)
    return buffer.getvalue()


def dumps_function(function: Any, name: str, kind: str = "function") -> bytes:
    """``function`` (or an actor class: ``kind`` "actor class") pickled by value, or
    TypeError with the report on what it captures."""
    try:
        return _dumps_keeping_files(function)
    except Exception as error:
        raise TypeError(unpicklable_message(
            kind, function, error,
            "Check what it captures from its enclosing scope (locks, open files, sockets "
            "cannot be pickled): create such objects inside it instead.",
            display_name(name), show_value=False)) from error


def check_function_size(data: bytes, name: str, kind: str) -> None:
    """Ray's limits on a pickled remote function (``kind`` "remote function") or actor
    class ("actor"): past ``FUNCTION_SIZE_ERROR_THRESHOLD`` ValueError, past 10 MB a
    warning, each in Ray's words; what it captures is the usual cause."""
    size = len(data)
    if size <= config.FUNCTION_SIZE_WARN_BYTES:
        return
    limit = config.function_size_error_bytes()
    advice = ("Check that its definition is not implicitly capturing a large array or other "
              "object in scope. Tip: use ray.put() to put large objects in the Ray object "
              "store.")
    if size >= limit:
        raise ValueError(f"The {kind} {name} is too large ({size // (1 << 20)} MiB > "
                         f"FUNCTION_SIZE_ERROR_THRESHOLD={limit // (1 << 20)} MiB). {advice}")
    logging.getLogger("miniray").warning(
        "Warning: The %s %s is very large (%d MiB). %s", kind, name, size // (1 << 20), advice)


# A value's repr in an error is cut here: the report below it shows the culprit itself.
_REPR_LIMIT = 500


def unpicklable_message(what: str, value: Any, error: BaseException, advice: str,
                        where: str = "", show_value: bool = True) -> str:
    """Ray's message for a value that could not be pickled: "Could not serialize the
    <what> <value or where>[ <where>]:", the report on ``value`` (or, when there is none,
    the pickling error itself), then ``advice``."""
    head = f"Could not serialize the {what}"
    if show_value:
        try:
            shown = repr(value)
        except Exception:  # the error is about pickling; a failing repr must not hide it
            shown = f"<{type(value).__qualname__} object>"
        if len(shown) > _REPR_LIMIT:
            shown = shown[:_REPR_LIMIT] + "...>"
        head += f" {shown}"
    if where:
        head += f" {where}"
    body = serializability.report(value) or f"{type(error).__name__}: {error}"
    return f"{head}:\n{body}\n{advice}"


def display_name(name: str) -> str:
    """``module.name`` as Ray shows it in errors: ``__main__`` is the script's own module
    name (its file's, ``job.py`` -> ``job``); a program with no file keeps ``__main__``."""
    if not name.startswith("__main__."):
        return name
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return name
    stem = path.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return f"{stem}.{name[len('__main__.'):]}" if stem.isidentifier() else name


def _find_unpicklable(values: list) -> Any:
    for value in values:
        try:
            cloudpickle.dumps(value, protocol=PROTOCOL)
        except Exception:
            return value
    return None
