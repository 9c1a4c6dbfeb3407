"""The documents' examples, run verbatim with ``ray`` meaning miniray.

Owns what each example must show: the reading of manifest.json's ``expect`` keys, applied to a
finished run, and the tests that the manifest, the files on disk and unsupported.py agree.
Does not own how a run happens (conftest.py: environment, modes, timeout, leak scan) nor which
examples are skipped (unsupported.py).

How ``expect`` is read (driver output with ANSI codes removed, split on "\\n"):

* ``exit_code``: the driver's exit status equals it.
* ``stdout_all``: every regex matches at least one stdout line (``re.search``, ``re.M``, one
  line at a time).
* ``stdout_count``: for each regex, exactly N stdout lines match.
* ``stderr_any``: every regex in the list matches at least one stderr line (alternatives are
  written inside a regex with ``|``).
* ``max_wall_seconds``: the run, from starting the process to its exit, took at most that long.
* ``distinct_pids_in``: on the lines counted by ``stdout_count``, the ``pid=(\\d+)`` values
  differ from line to line (one line may repeat its own pid, as the "(name pid=N)" prefix
  and the TensorFlow stand-in both do). The value is a description only.
* ``after``: nothing of the run is left once it returns; this is the leak check made after
  every run (processes, /dev/shm segments, session directories), so it needs no extra step.
* ``why``: documentation only.

An unknown key or need fails the run's test rather than being ignored.
"""

from __future__ import annotations

import os
import re

import pytest

KNOWN_EXPECT_KEYS = {
    "exit_code",
    "stdout_all",
    "stdout_count",
    "stderr_any",
    "max_wall_seconds",
    "distinct_pids_in",
    "after",
    "why",
}
KNOWN_NEEDS = {"tensorflow-stub", "ray-command"}
PID_RE = re.compile(r"pid=(\d+)")


def _matching(pattern: str, lines: list) -> list:
    regex = re.compile(pattern, re.M)
    return [line for line in lines if regex.search(line)]


def check_expectations(expect: dict, result) -> list:
    """Every way the run falls short of ``expect``, as readable sentences (empty: it passed)."""
    problems = []
    unknown = sorted(set(expect) - KNOWN_EXPECT_KEYS)
    if unknown:
        problems.append(f"manifest: expect keys this harness does not understand: {unknown}")
    stdout, stderr = result.stdout_lines, result.stderr_lines
    if "exit_code" in expect and result.returncode != expect["exit_code"]:
        problems.append(f"exit_code: got {result.returncode}, expected {expect['exit_code']}")
    for pattern in expect.get("stdout_all", []):
        if not _matching(pattern, stdout):
            problems.append(f"stdout_all: no stdout line matches {pattern!r}")
    counted = []
    for pattern, wanted in expect.get("stdout_count", {}).items():
        lines = _matching(pattern, stdout)
        counted.extend(lines)
        if len(lines) != wanted:
            problems.append(
                f"stdout_count: {len(lines)} stdout lines match {pattern!r}, "
                f"expected exactly {wanted}"
            )
    for pattern in expect.get("stderr_any", []):
        if not _matching(pattern, stderr):
            problems.append(f"stderr_any: no stderr line matches {pattern!r}")
    if "max_wall_seconds" in expect and result.wall_s > float(expect["max_wall_seconds"]):
        problems.append(
            f"max_wall_seconds: the run took {result.wall_s:.2f} s, more than "
            f"{expect['max_wall_seconds']} s ({expect.get('why', 'no reason given')})"
        )
    if "distinct_pids_in" in expect:
        if "stdout_count" not in expect:
            problems.append("manifest: distinct_pids_in needs stdout_count to say which lines")
        else:
            problems += _check_distinct_pids(counted, expect["distinct_pids_in"])
    return problems


def _check_distinct_pids(lines: list, why: str) -> list:
    seen = {}
    problems = []
    for line in lines:
        pids = set(PID_RE.findall(line))
        if not pids:
            problems.append(f"distinct_pids_in: no pid= on counted line {line!r}")
        for pid in sorted(pids):
            if pid in seen:
                problems.append(
                    f"distinct_pids_in: pid {pid} appears on two lines, expected "
                    f"distinct processes ({why}): {seen[pid]!r} and {line!r}"
                )
            seen[pid] = line
    return problems


def test_doc_example(doc_case, run_doc_example):
    """Run one example in one mode and check what the manifest says it must show."""
    result = run_doc_example(doc_case)
    problems = []
    unknown_needs = sorted(set(doc_case.needs) - KNOWN_NEEDS)
    if unknown_needs:
        problems.append(f"manifest: needs this harness does not understand: {unknown_needs}")
    if result.timed_out:
        problems.append(
            f"timeout: still running after {result.timeout_s:.0f} s; its process "
            "group was killed with SIGKILL"
        )
    else:
        expect = doc_case.expect
        if os.environ.get("MINIRAY_EXAMPLES_ON_RAY", "") not in ("", "0"):
            # On Ray the run includes Ray's own start (3 to 5 s here), which the wall-time
            # bounds, written for miniray's embedded start, do not allow for.
            expect.pop("max_wall_seconds", None)
        problems += check_expectations(expect, result)
    where = " (manifest 'after')" if "after" in doc_case.expect else ""
    problems += [f"leak{where}: {leak}" for leak in result.leaks]
    if problems:
        pytest.fail(result.report(problems), pytrace=False)
    result.cleanup()


def test_manifest_matches_files_on_disk(doc_examples):
    """Every manifest entry has its file, and every s*.py / s*.sh on disk is in the manifest."""
    doc_examples.require()
    listed = [entry.get("file") for entry in doc_examples.entries]
    duplicates = sorted({name for name in listed if listed.count(name) > 1})
    assert not duplicates, f"files listed twice in manifest.json: {duplicates}"
    on_disk = doc_examples.files_on_disk()
    missing = sorted(name for name in listed if not (doc_examples.root / str(name)).is_file())
    unlisted = sorted(set(on_disk) - set(listed))
    assert not missing, f"in manifest.json but not in {doc_examples.root}: {missing}"
    assert not unlisted, f"in {doc_examples.root} but not in manifest.json: {unlisted}"


def test_manifest_is_understood(doc_examples):
    """Each entry uses only expect keys and needs this harness checks, and .sh <=> ray-command."""
    doc_examples.require()
    problems = []
    for entry in doc_examples.entries:
        name = entry.get("file", "?")
        needs = entry.get("needs", [])
        unknown_keys = sorted(set(entry.get("expect", {})) - KNOWN_EXPECT_KEYS)
        unknown_needs = sorted(set(needs) - KNOWN_NEEDS)
        if unknown_keys:
            problems.append(f"{name}: unknown expect keys {unknown_keys}")
        if unknown_needs:
            problems.append(f"{name}: unknown needs {unknown_needs}")
        if name.endswith(".sh") != ("ray-command" in needs):
            problems.append(f"{name}: shell examples, and only they, need 'ray-command'")
        if "distinct_pids_in" in entry.get("expect", {}) and "stdout_count" not in entry["expect"]:
            problems.append(f"{name}: distinct_pids_in without stdout_count")
    assert not problems, "manifest.json:\n" + "\n".join(problems)


def test_unsupported_list_is_consistent(doc_examples, unsupported_examples):
    """Every key of unsupported.UNSUPPORTED is an example of the manifest, with a reason."""
    doc_examples.require()
    listed = {entry.get("file") for entry in doc_examples.entries}
    unknown = sorted(name for name in unsupported_examples if name not in listed)
    assert not unknown, f"unsupported.py names files that are not in manifest.json: {unknown}"
    absent = sorted(
        name for name in unsupported_examples if not (doc_examples.root / name).is_file()
    )
    assert not absent, f"unsupported.py names files missing from {doc_examples.root}: {absent}"
    no_reason = sorted(
        name
        for name, reason in unsupported_examples.items()
        if not isinstance(reason, str) or not reason.strip()
    )
    assert not no_reason, f"unsupported.py entries without a reason: {no_reason}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import ray\n", "import miniray as ray\n"),
        ("import ray as r\n", "import miniray as r\n"),
        ("import os, ray\n", "import os, miniray as ray\n"),
        (
            "import ray.util.accelerators\n",
            "import miniray.util.accelerators; import miniray as ray\n",
        ),
        (
            "from ray.util.accelerators import NVIDIA_TESLA_V100\n",
            "from miniray.util.accelerators import NVIDIA_TESLA_V100\n",
        ),
        (
            "from ray import (\n    get,\n    put,\n)\n",
            "from miniray import (\n    get,\n    put,\n)\n",
        ),
        (
            "def f():\n    import ray\n    return ray\n",
            "def f():\n    import miniray as ray\n    return ray\n",
        ),
        ("x = 1; import ray; y = 2\n", "x = 1; import miniray as ray; y = 2\n"),
        ("# import ray\ns = 'import ray'\n", "# import ray\ns = 'import ray'\n"),
        (
            "import rayx\nfrom raylib import a\nfrom . import ray\n",
            "import rayx\nfrom raylib import a\nfrom . import ray\n",
        ),
        ("print('é'); import ray  # ray\n", "print('é'); import miniray as ray  # ray\n"),
    ],
)
def test_import_rewrite(ray_import_rewriter, source, expected):
    """The ``import`` mode touches real ray imports only, and keeps line numbers."""
    rewritten, _changes = ray_import_rewriter(source)
    assert rewritten == expected
    assert rewritten.count("\n") == source.count("\n")
