"""``miniray.util.joblib``: run joblib (and scikit-learn) loops on miniray.

Mirrors ``ray.util.joblib`` (Ray 2.60): ``register_ray()`` registers the ``"ray"`` backend,
then ``joblib.parallel_config(backend="ray")`` (or ``parallel_backend("ray")``) sends each
batch of a ``Parallel`` loop to a pool of ``n_jobs`` actors. Differs: importing this module
works without joblib; ``register_ray()`` is what raises ``ImportError`` then, saying to
install joblib (Ray's module fails at import).

joblib is an optional dependency (``pip install 'miniray[joblib]'``); nothing here imports it
before ``register_ray()`` is called.

Example:
    >>> from joblib import Parallel, delayed, parallel_config
    >>> register_ray()
    >>> with parallel_config(backend="ray"):
    ...     Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4))
    [0, 1, 2, 3]
"""

from __future__ import annotations

__all__ = ["register_ray"]


def register_ray() -> None:
    """Register the ``"ray"`` joblib backend (miniray's actors), for
    ``joblib.parallel_config(backend="ray")``.

    Raises:
        ImportError: joblib is not installed.
    """
    try:
        from joblib.parallel import register_parallel_backend  # lazy: joblib is optional
    except ImportError as error:
        raise ImportError(
            "ray.util.joblib needs the joblib package, which is not installed: run "
            "'pip install joblib' (or install miniray with the extra: "
            "pip install 'miniray[joblib]').") from error
    from miniray.util.joblib.ray_backend import RayBackend  # lazy: it imports joblib

    register_parallel_backend("ray", RayBackend)
