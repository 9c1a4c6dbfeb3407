"""Small public names of Ray 2.60 that programs and libraries built on Ray use: the stability
decorators of ``ray.util.annotations``, ``ray.Language``, Ray's mode and num_returns constants,
``ray.exceptions.RAY_EXCEPTION_TYPES``, ``ray.util.debug.Suspect``, ``ObjectRef.redis_shard_hash``.
Each expected value was read from Ray 2.60 in its own virtualenv."""

from __future__ import annotations

import pickle
import warnings

import pytest

import miniray
from miniray import exceptions
from miniray.util import annotations as an


def _fn():
    "doc"


def _decorated(decorator):
    def f():
        "doc"
    return decorator(f)


def test_public_api_stable_leaves_the_doc_and_records_the_annotation():
    f = _decorated(an.PublicAPI)
    assert f.__doc__ == "doc"
    assert (f._annotated, f._annotated_type, f._annotated_api_group) == (
        "f", an.AnnotationType.PUBLIC_API, "Others")
    g = _decorated(an.PublicAPI(api_group="X"))
    assert g._annotated_api_group == "X" and g.__doc__ == "doc"


@pytest.mark.parametrize("stability", ["alpha", "beta"])
def test_public_api_alpha_and_beta_append_Rays_line(stability):
    f = _decorated(an.PublicAPI(stability=stability))
    assert f.__doc__ == (f"doc\n\n**PublicAPI ({stability}):** This API is in {stability} and "
                         "may change before becoming stable.\n")


def test_public_api_refuses_an_unknown_stability():
    with pytest.raises(AssertionError, match="foo"):
        an.PublicAPI(stability="foo")


def test_developer_api_appends_its_line():
    f = _decorated(an.DeveloperAPI)
    assert f.__doc__ == "doc\n\n**DeveloperAPI:** This API may change across minor Ray releases.\n"
    assert f._annotated_type is an.AnnotationType.DEVELOPER_API


def test_deprecated_appends_a_warning_block_with_the_message():
    f = _decorated(an.Deprecated(message="use g"))
    assert f.__doc__ == ("doc\n\n.. warning::\n\n    **DEPRECATED**: This API is deprecated and "
                         "may be removed in future Ray releases.\n    use g\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f()  # no warning unless asked for


def test_deprecated_with_warning_warns_on_each_call_and_instantiation():
    f = _decorated(an.Deprecated(message="use g", warning=True))

    class C:
        def __init__(self, x):
            self.x = x

    C2 = an.Deprecated(message="old", warning=True)(C)
    assert C2 is C
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f()
        f()
        assert C2(3).x == 3
    assert [w.category for w in caught] == [an.RayDeprecationWarning] * 3
    assert str(caught[0].message).endswith("\nuse g")
    assert str(caught[2].message).endswith("\nold")
    with pytest.raises(ValueError, match="Unknown kwargs"):
        an.Deprecated(foo=1)


def test_language_members_print_their_names_and_keep_identity():
    L = miniray.Language
    assert (str(L.PYTHON), repr(L.JAVA), L.CPP.value(), L.PYTHON.value()) == (
        "PYTHON", "JAVA", 2, 0)
    assert L.PYTHON == L.PYTHON and L.PYTHON != 0
    assert pickle.loads(pickle.dumps(L.JAVA)) is L.JAVA


def test_constants_have_Rays_values():
    assert (miniray.SCRIPT_MODE, miniray.WORKER_MODE) == (0, 1)
    assert miniray.actor.DEFAULT_MAX_CONCURRENCY_ASYNC == 1000
    assert miniray.actor.STREAMING_GENERATOR_RETURN == -2
    assert miniray.remote_function.STREAMING_GENERATOR_RETURN == -2
    assert exceptions.PYTHON == 0


def test_ray_exception_types_lists_Rays_thirty_types_in_order():
    names = [t.__name__ for t in exceptions.RAY_EXCEPTION_TYPES]
    assert len(names) == 30
    assert names[:3] == ["PlasmaObjectNotAvailable", "RayError", "RayTaskError"]
    assert names[-1] == "AuthenticationError"
    assert all(issubclass(t, exceptions.RayError) for t in exceptions.RAY_EXCEPTION_TYPES)


def test_suspect_has_Rays_fields():
    from miniray.util.debug import Suspect

    assert Suspect._fields == ("traceback", "memory_increase", "slope", "rvalue", "hist")


def test_redis_shard_hash_is_stable_and_differs_between_ids():
    a, b = miniray.ObjectRef.from_random(), miniray.ObjectRef.from_random()
    assert a.redis_shard_hash() == miniray.ObjectRef(a.binary()).redis_shard_hash()
    assert a.redis_shard_hash() != b.redis_shard_hash()
    assert 0 <= a.redis_shard_hash() < 2 ** 64


def test_internal_is_an_empty_namespace_as_in_ray():
    import miniray.internal

    assert miniray.internal.__all__ == []
