"""``miniray.util.joblib``: joblib's ``Parallel`` (and scikit-learn) on a pool of actors.

Compared with Ray 2.60 (its venv, joblib 1.6): ``n_jobs=2`` runs the calls in two actor
processes, never the driver; ``n_jobs=1`` runs them in the driver; ``n_jobs=-1`` means the
cluster's CPUs; more jobs than CPUs raises the Pool's ``ValueError`` ("Tried to start a pool
with 4 processes ..."); a call's ``ValueError`` reaches the caller as a plain ``ValueError``.
joblib is an optional dependency: the tests that need it skip where it is not installed
(the ``[test]`` extra installs it, so CI runs them); the scikit-learn test skips without
scikit-learn.
"""

from __future__ import annotations

import os
import sys

import pytest


def _joblib():
    return pytest.importorskip("joblib", reason="joblib is not installed (pip install joblib)")


def _square_and_pid(i):
    return i * i, os.getpid()


def test_parallel_runs_its_calls_on_actors_with_the_ray_backend(ray):
    joblib = _joblib()
    from miniray.util.joblib import register_ray

    register_ray()
    with joblib.parallel_config(backend="ray"):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(_square_and_pid)(i) for i in range(10))
    assert [value for value, _ in out] == [i * i for i in range(10)]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    # The pool's actors are gone once the loop is over (the fixture checks no process leaks).
    with joblib.parallel_backend("ray"):  # the older spelling works too
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(abs)(-i) for i in range(5))
    assert out == list(range(5))


def test_n_jobs_one_runs_in_the_driver_and_minus_one_means_the_clusters_cpus(ray_start):
    joblib = _joblib()
    from miniray.util.joblib import register_ray

    ray_start(num_cpus=3)
    register_ray()
    with joblib.parallel_config(backend="ray"):
        out = joblib.Parallel(n_jobs=1)(joblib.delayed(_square_and_pid)(i) for i in range(3))
        assert {pid for _, pid in out} == {os.getpid()}
        assert joblib.effective_n_jobs(-1) == 3  # this host may have fewer cores
        out = joblib.Parallel(n_jobs=-1)(joblib.delayed(_square_and_pid)(i) for i in range(6))
    assert [value for value, _ in out] == [i * i for i in range(6)]


def test_more_jobs_than_cpus_and_a_failing_call_raise_as_in_ray(ray):
    joblib = _joblib()
    from miniray.util.joblib import register_ray

    def fails_on_three(i):
        if i == 3:
            raise ValueError("bad three")
        return i

    register_ray()
    with joblib.parallel_config(backend="ray"):
        with pytest.raises(ValueError, match="Tried to start a pool with 4 processes .* only 2 "
                                             "CPUs"):
            joblib.Parallel(n_jobs=4)(joblib.delayed(abs)(i) for i in range(4))
        with pytest.raises(ValueError, match="bad three"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(fails_on_three)(i) for i in range(6))


def test_ray_remote_args_configure_the_pools_actors(ray):
    joblib = _joblib()
    from miniray.util.joblib import register_ray

    def tag(_):
        return os.environ.get("JOBLIB_TEST_TAG")

    register_ray()
    args = {"runtime_env": {"env_vars": {"JOBLIB_TEST_TAG": "from-config"}}}
    with joblib.parallel_config(backend="ray", ray_remote_args=args):
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(tag)(i) for i in range(4)) == [
            "from-config"] * 4


def test_scikit_learn_cross_validation_runs_on_the_ray_backend(ray):
    joblib = _joblib()
    pytest.importorskip("sklearn", reason="scikit-learn is not installed")
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    from miniray.util.joblib import register_ray

    register_ray()
    features, labels = load_iris(return_X_y=True)
    with joblib.parallel_config(backend="ray"):
        scores = cross_val_score(LogisticRegression(max_iter=500), features, labels, cv=4,
                                 n_jobs=2)
    assert len(scores) == 4 and min(scores) > 0.8


def test_register_ray_without_joblib_says_to_install_it(monkeypatch):
    import miniray.util.joblib as miniray_joblib  # importing needs no joblib

    for name in [m for m in sys.modules if m == "joblib" or m.startswith("joblib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "joblib", None)  # makes "import joblib" fail
    with pytest.raises(ImportError, match=r"pip install joblib.*miniray\[joblib\]"):
        miniray_joblib.register_ray()
