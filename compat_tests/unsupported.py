"""The documents' examples that miniray does not run yet, in one place.

Owns the list only. conftest.py reads it (by path) and marks every test of a listed example
as skipped with its reason; test_doc_examples.py checks that every key names an example of
the manifest. Remove an entry when the issue that brings it lands; to see which listed
examples already pass, run with ``MINIRAY_COMPAT_RUN_UNSUPPORTED=1``.

Keys are example file names; values say what is missing and the issue that brings it. An
example that needs two features names both.
"""

from __future__ import annotations

ACTORS = "actors (issue 4)"
START_STOP = "miniray start/stop (issue 6)"

UNSUPPORTED = {
    "s000_03_gpu_actor_definition.py": ACTORS,
    "s000_04_gpu_actor_tensorflow.py": ACTORS,
    "s000_05_ray_start_head.sh": START_STOP,
    "s003_01_gpu_actor_and_task.py": ACTORS,
    "s003_04_fractional_packing.py": ACTORS,
    "s003_08_cuda_visible_devices_at_start.sh": START_STOP,
    "s004_05_counter_actor.py": ACTORS,
    "s004_06_actor_resources.py": ACTORS,
}
