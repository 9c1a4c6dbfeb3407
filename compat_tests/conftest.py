"""How the documents' examples are run with ``ray`` meaning miniray.

Owns: finding the doc-examples folder and its ``manifest.json``, turning every (example, mode)
into one test parameter, building the environment of one run, running it in a session of its
own under a hard timeout, and the leak checks that follow every run. Does not own: what an
example must show, which ``test_doc_examples.py`` reads from the manifest's ``expect``; the
list of examples not yet supported (``unsupported.py``); the ``import`` mode's source rewrite
(``rewrite_imports.py``). Called by pytest only; nothing here is miniray API.

One run::

    pytest ── Popen(start_new_session=True) ──► driver, one of
      │         run:    python -m miniray run <example.py>
      │         import: python <copy of example.py with its ray imports rewritten>
      │         bash:   bash <example.sh>  (PATH: ray -> python -m miniray; PYTHONPATH: ray.py shim)
      │       env: MINIRAY_TMPDIR=<fresh dir>, MINIRAY_HOST_DIR=<it>/host, PYTHONUNBUFFERED=1,
      │            no RAY_ADDRESS, cwd=<fresh dir>
      │       on Ray (MINIRAY_EXAMPLES_ON_RAY=1, the tox env ``ray``):
      │         import: python -m miniray run --ray <rewritten copy>  (``miniray`` means Ray)
      │         run:    python <example.py>                          (``import ray``, unchanged)
      │         bash:   skipped (it drives the ``ray`` command itself, not a program)
      │         env also: HOME=<the run's MINIRAY_TMPDIR> (Ray's token), RAY_TMPDIR=<short
      │         fresh dir> (Ray's sockets must fit 107 bytes), so Ray writes only there
      │       stdout/stderr -> files, so a leaked grandchild holding them open cannot block us
      ├─ wait(timeout) ─ past it: SIGKILL the whole process group
      └─ leak scan (after a short grace): processes whose session or process group is the
         driver's pid, or whose environment holds this run's MINIRAY_TMPDIR (a daemon that
         called setsid() is still found); new names in /dev/shm (or MINIRAY_SHM_DIR) starting
         with mr_<root tag of this run's MINIRAY_TMPDIR> (session.root_tag) or containing its
         name; session_* directories left in MINIRAY_TMPDIR; anything new in the user's own
         session root or host GPU directory (``user_places``).
         Leaked pids, and only those, are SIGKILLed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_ENV = "MINIRAY_DOC_EXAMPLES"
DEFAULT_EXAMPLES_DIR = REPO_ROOT.parent / "shared" / "doc-examples"
# Set to 1 to run the examples listed in unsupported.py anyway (to see which now pass).
RUN_UNSUPPORTED_ENV = "MINIRAY_COMPAT_RUN_UNSUPPORTED"
# Set to 1 (the tox env ``ray``) to run the examples on real Ray instead of miniray: the
# rewritten copies through ``miniray run --ray``, the verbatim ones with plain ``python``.
ON_RAY_ENV = "MINIRAY_EXAMPLES_ON_RAY"

# Removed from every run's environment, so no run joins a node the user started.
UNSET_ENV = ("RAY_ADDRESS", "MINIRAY_ADDRESS")
PYTHON_MODES = ("run", "import")
SHELL_MODE = "bash"
MIN_TIMEOUT_S = 120.0
OUTPUT_TAIL_LINES = 60
# Workers may still be exiting for a moment after the driver returns (death signals are
# asynchronous); only what is still there after this grace counts as a leak.
LEAK_GRACE_S = 3.0
# Where the runs' segments go: MINIRAY_SHM_DIR when the harness's environment sets it (the
# runs inherit it), else /dev/shm.
SHM_DIR = Path(os.environ.get("MINIRAY_SHM_DIR") or "/dev/shm")
PROC_DIR = Path("/proc")

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def on_ray() -> bool:
    """True when the examples run on real Ray (``MINIRAY_EXAMPLES_ON_RAY=1``)."""
    return os.environ.get(ON_RAY_ENV, "") not in ("", "0")


def in_ci() -> bool:
    """True when the environment variable CI is ``true`` (any case)."""
    return os.environ.get("CI", "").strip().lower() == "true"


def strip_ansi(text: str) -> str:
    return _ANSI_RE.sub("", text)


# --------------------------------------------------------------------------- the examples


@dataclass(frozen=True)
class DocCase:
    """One test parameter: an example file and the way it is run."""

    file: str
    mode: str  # "run", "import" or "bash"
    entry: dict = field(compare=False, hash=False)

    @property
    def id(self) -> str:
        return f"{self.file}-{self.mode}"

    @property
    def needs(self) -> list:
        return list(self.entry.get("needs", []))

    @property
    def expect(self) -> dict:
        return dict(self.entry.get("expect", {}))

    @property
    def timeout_s(self) -> float:
        max_wall = self.expect.get("max_wall_seconds")
        if max_wall is None:
            return MIN_TIMEOUT_S
        return max(MIN_TIMEOUT_S, 3 * float(max_wall) + 60)


class DocExamples:
    """The doc-examples folder and its manifest, or why they could not be read."""

    def __init__(
        self, root: Path, manifest: dict | None, problem: str | None, missing: bool
    ) -> None:
        self.root = root
        self.manifest = manifest
        self.problem = problem
        self.missing = missing

    def __repr__(self) -> str:
        state = self.problem or f"{len(self.entries)} examples"
        return f"<DocExamples {self.root}: {state}>"

    @classmethod
    def locate(cls) -> DocExamples:
        env = os.environ.get(EXAMPLES_ENV)
        root = Path(env).expanduser() if env else DEFAULT_EXAMPLES_DIR
        source = f"${EXAMPLES_ENV}" if env else f"the default (${EXAMPLES_ENV} is not set)"
        manifest_path = root / "manifest.json"
        if not manifest_path.is_file():
            return cls(
                root,
                None,
                f"doc examples not found: {manifest_path} does not exist (folder from {source})",
                missing=True,
            )
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if not isinstance(manifest.get("examples"), list):
                raise ValueError("it has no 'examples' list")
        except (OSError, ValueError) as error:
            return cls(root, None, f"{manifest_path} is unreadable: {error}", missing=False)
        return cls(root, manifest, None, missing=False)

    def require(self) -> None:
        """Skip (or, when CI is true, fail) the calling test if the examples are unusable.

        Call it from a test body, so that in CI a missing folder is a test failure, not an
        error in a fixture. An unreadable manifest always fails.
        """
        if self.problem is None:
            return
        if self.missing and not in_ci():
            pytest.skip(f"{self.problem}; set {EXAMPLES_ENV} to the folder to run these")
        pytest.fail(f"{self.problem} (CI is true, so this is a failure, not a skip)", pytrace=False)

    @property
    def entries(self) -> list:
        return list(self.manifest["examples"]) if self.manifest else []

    @property
    def stubs_dir(self) -> Path:
        return self.root / "stubs"

    def files_on_disk(self) -> list:
        """Example files present in the folder: s*.py and s*.sh at its top level."""
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_file() and p.name.startswith("s") and p.suffix in (".py", ".sh")
        )

    def cases(self) -> list:
        cases = []
        for entry in self.entries:
            modes = (SHELL_MODE,) if "ray-command" in entry.get("needs", []) else PYTHON_MODES
            cases.extend(DocCase(entry["file"], mode, entry) for mode in modes)
        return cases


_EXAMPLES: DocExamples | None = None


def _doc_examples() -> DocExamples:
    global _EXAMPLES
    if _EXAMPLES is None:
        _EXAMPLES = DocExamples.locate()
    return _EXAMPLES


def _load_sibling(name: str) -> ModuleType:
    # Loaded by path, so it works under every pytest import mode and never clashes with a
    # module of the same name elsewhere on sys.path (conftest.py itself cannot be imported
    # reliably: pytest drops sys.modules["conftest"] between rootless conftests).
    qualified = f"miniray_compat_{name}"
    if qualified not in sys.modules:
        path = Path(__file__).with_name(f"{name}.py")
        spec = importlib.util.spec_from_file_location(qualified, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[qualified]
            raise
    return sys.modules[qualified]


def _load_unsupported() -> dict:
    return dict(_load_sibling("unsupported").UNSUPPORTED)


def _load_different_on_ray() -> dict:
    return dict(_load_sibling("unsupported").DIFFERENT_ON_RAY)


def rewrite_ray_imports(source: str) -> tuple:
    """See rewrite_imports.py."""
    return _load_sibling("rewrite_imports").rewrite_ray_imports(source)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One ``doc_case`` per (example, mode); examples in unsupported.py are skipped."""
    if "doc_case" not in metafunc.fixturenames:
        return
    examples = _doc_examples()
    if examples.problem is not None:
        # A single placeholder, so the problem is reported (skip, or failure in CI).
        metafunc.parametrize("doc_case", [pytest.param(None, id="doc-examples-unavailable")])
        return
    unsupported = _load_unsupported()
    different_on_ray = _load_different_on_ray()
    run_anyway = os.environ.get(RUN_UNSUPPORTED_ENV, "") not in ("", "0")
    params = []
    for case in examples.cases():
        marks = []
        if on_ray():
            # What miniray lacks does not matter on Ray; a shell example drives the `ray`
            # command, which is Ray's own CLI there, not a program `miniray run --ray` runs.
            if case.mode == SHELL_MODE:
                marks.append(pytest.mark.skip(
                    reason="on Ray: a shell example drives the `ray` command itself, "
                           "not a program for `miniray run --ray`"))
            elif case.file in different_on_ray:
                how, why = different_on_ray[case.file]
                mark = pytest.mark.skip if how == "skip" else pytest.mark.xfail
                marks.append(mark(reason=f"on Ray: {why} (compat_tests/unsupported.py)"))
        elif case.file in unsupported and not run_anyway:
            reason = f"not yet supported: {unsupported[case.file]} (compat_tests/unsupported.py)"
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(case, id=case.id, marks=marks))
    metafunc.parametrize("doc_case", params)


# --------------------------------------------------------------------------- leak scanning


@dataclass(frozen=True)
class FoundProcess:
    pid: int
    starttime: int
    cmdline: str
    why: str


def _read_stat(pid: int) -> tuple | None:
    """(state, pgrp, session, starttime) from /proc/<pid>/stat, or None if it is gone."""
    try:
        data = (PROC_DIR / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # the command name may hold spaces
    return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        raw = (PROC_DIR / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:200]


def find_run_processes(leader: int, env_marker: bytes) -> list:
    """Live (non-zombie) processes of one run: its session/group, or its MINIRAY_TMPDIR."""
    found = []
    if not PROC_DIR.is_dir():
        return found
    for name in os.listdir(PROC_DIR):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        stat = _read_stat(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            continue
        state, pgrp, session, starttime = stat
        if session == leader or pgrp == leader:
            why = f"in the run's session {leader}"
        else:
            try:
                environ = (PROC_DIR / name / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if env_marker not in environ:
                continue
            why = "outside the run's session, but with the run's MINIRAY_TMPDIR"
        found.append(FoundProcess(pid, starttime, _cmdline(pid), why))
    return found


def kill_found(processes: list) -> None:
    """SIGKILL each found process, unless its pid now belongs to another process."""
    for proc in processes:
        stat = _read_stat(proc.pid)
        if stat is None or stat[3] != proc.starttime:
            continue
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _shm_names() -> set:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def user_places() -> tuple:
    """The user's own session root and host GPU directory: where miniray writes when
    MINIRAY_TMPDIR and MINIRAY_HOST_DIR are unset. A run sets both to folders of its own, so
    it must add nothing here."""
    from miniray._private.ledger.host_gpus import default_host_dir

    unset = {k: v for k, v in os.environ.items() if k != "MINIRAY_HOST_DIR"}
    return (f"/dev/shm/miniray-{os.getuid()}", default_host_dir(unset))


def snapshot_places(places) -> dict:
    """``{place: its entries}``, None for a place that does not exist."""
    found = {}
    for place in places:
        try:
            found[place] = set(os.listdir(place))
        except OSError:
            found[place] = None
    return found


def gained_in_places(before: dict) -> list:
    """What appeared in the places of ``before`` since it was taken: a place created, or its
    new entries."""
    gained = []
    for place, after in snapshot_places(before).items():
        if after is None:
            continue
        if before[place] is None:
            gained.append(f"{place} (created, holding {sorted(after)})")
        else:
            gained += [os.path.join(place, name) for name in sorted(after - before[place])]
    return gained


# --------------------------------------------------------------------------- one run


def _miniray_path_entry() -> str | None:
    """The folder to put on PYTHONPATH so children import the miniray this process would.

    The source tree when that is where miniray comes from (or when it is not importable at
    all); nothing when it is installed, so an installed package is what gets tested.
    """
    spec = importlib.util.find_spec("miniray")
    if spec is None:
        return str(REPO_ROOT)
    locations = list(spec.submodule_search_locations or [])
    location = Path(locations[0]) if locations else Path(spec.origin or "").parent
    if location.resolve().parent == REPO_ROOT:
        return str(REPO_ROOT)
    return None


@dataclass
class RunResult:
    """What one run did, and everything a failure message needs."""

    case: DocCase
    command: list
    cwd: Path
    tmpdir: Path
    workdir: Path
    env_shown: list  # "NAME=value" words, shell-quoted, for the reproduce line
    timeout_s: float
    returncode: int | None = None
    wall_s: float = 0.0
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    leaks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    extra_dirs: list = field(default_factory=list)  # removed with the others once it passed

    @property
    def stdout_lines(self) -> list:
        return self.stdout.split("\n")

    @property
    def stderr_lines(self) -> list:
        return self.stderr.split("\n")

    def reproduce(self) -> str:
        unset = " ".join(f"-u {name}" for name in UNSET_ENV)
        return (
            f"cd {shlex.quote(str(self.cwd))} && env {unset} {' '.join(self.env_shown)} "
            f"{shlex.join(self.command)}"
        )

    def report(self, problems: list) -> str:
        code = self.returncode
        if code is not None and code < 0:
            try:
                code = f"{code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        parts = [f"{self.case.file} [{self.case.mode}] failed:"]
        parts += [f"  - {problem}" for problem in problems]
        parts += [
            f"command:   {shlex.join(self.command)}",
            f"exit code: {code}    wall time: {self.wall_s:.2f} s (timeout {self.timeout_s:.0f} s)",
            f"reproduce: {self.reproduce()}",
            f"kept for inspection: {self.workdir} and MINIRAY_TMPDIR {self.tmpdir}",
        ]
        parts += self.notes
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            lines = text.split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            tail = lines[-OUTPUT_TAIL_LINES:]
            parts.append(f"--- {name} (last {len(tail)} of {len(lines)} lines) ---")
            parts.extend(tail)
        parts.append("--- end ---")
        return "\n".join(parts)

    def cleanup(self) -> None:
        """Remove the run's folders; called once a run passed (failed runs keep them)."""
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        for folder in self.extra_dirs:
            shutil.rmtree(folder, ignore_errors=True)


class ExampleRunner:
    """Runs one DocCase in its own session, environment and folders."""

    def __init__(self, examples: DocExamples, base: Path) -> None:
        self.examples = examples
        self.base = base

    def run(self, case: DocCase) -> RunResult:
        workdir = Path(tempfile.mkdtemp(prefix="mrw-", dir=self.base))
        tmpdir = Path(tempfile.mkdtemp(prefix="mrt-", dir=self.base))
        cwd = workdir / "cwd"
        cwd.mkdir()
        example = self.examples.root / case.file
        notes = []
        env = dict(os.environ)
        for name in UNSET_ENV:
            env.pop(name, None)
        env["MINIRAY_TMPDIR"] = str(tmpdir)
        # The host GPU ledger too (it is written where GPUs, real or fake, are detected).
        env["MINIRAY_HOST_DIR"] = str(tmpdir / "host")
        env["PYTHONUNBUFFERED"] = "1"
        pythonpath = []
        if "tensorflow-stub" in case.needs:
            pythonpath.append(str(self.examples.stubs_dir))
        if on_ray():
            # Ray writes its session files under RAY_TMPDIR and a token under ~/.ray: both
            # into this run's folder, so the leak scan sees them and the user's stay untouched.
            # RAY_TMPDIR is a short folder of its own: Ray's socket paths under it
            # (ray/session_<date>_<pid>/sockets/plasma_store) must stay within 107 bytes.
            raydir = Path(tempfile.mkdtemp(prefix="mrr-", dir="/tmp"))
            env["RAY_TMPDIR"] = str(raydir)
            env["HOME"] = str(tmpdir)
            # Every worker line reaches the driver, as miniray prints them, so the counts
            # of the manifest apply (Ray folds repeated lines into "[repeated Nx]").
            env["RAY_DEDUP_LOGS"] = "0"
            notes.append(f"RAY_TMPDIR (Ray's session files and logs): {raydir}")
        if case.mode == "run":
            if on_ray():
                command = [sys.executable, str(example)]
            else:
                command = [sys.executable, "-m", "miniray", "run", str(example)]
        elif case.mode == "import":
            rewritten, changes = rewrite_ray_imports(example.read_text(encoding="utf-8"))
            target = workdir / "src" / case.file
            target.parent.mkdir()
            target.write_text(rewritten, encoding="utf-8")
            if on_ray():
                command = [sys.executable, "-m", "miniray", "run", "--ray", str(target)]
            else:
                command = [sys.executable, str(target)]
            notes.append(f"rewritten copy: {target}")
            notes += [f"  {change}" for change in changes or ["(no ray import found)"]]
        else:
            bindir, shimdir = self._shell_tools(workdir)
            env["PATH"] = str(bindir) + os.pathsep + env.get("PATH", os.defpath)
            pythonpath.append(str(shimdir))
            command = ["bash", str(example)]
            notes.append(f"ray/python wrappers: {bindir}; ray.py shim: {shimdir}")
        entry = _miniray_path_entry()
        if entry:
            pythonpath.append(entry)
        if env.get("PYTHONPATH"):
            pythonpath.append(env["PYTHONPATH"])
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        shown = [
            f"{name}={shlex.quote(env[name])}"
            for name in ("MINIRAY_TMPDIR", "MINIRAY_HOST_DIR", "RAY_TMPDIR", "HOME",
                         "PYTHONUNBUFFERED", "PYTHONPATH")
            if name in env
        ]
        if case.mode == SHELL_MODE:
            shown.append(f'PATH={shlex.quote(str(workdir / "bin"))}:"$PATH"')
        result = RunResult(case, command, cwd, tmpdir, workdir, shown, case.timeout_s, notes=notes)
        if on_ray():
            result.extra_dirs.append(raydir)
        self._execute(result, env)
        return result

    @staticmethod
    def _shell_tools(workdir: Path) -> tuple:
        bindir, shimdir = workdir / "bin", workdir / "shim"
        bindir.mkdir()
        shimdir.mkdir()
        exe = shlex.quote(sys.executable)
        scripts = {
            "ray": f'#!/bin/sh\nexec {exe} -m miniray "$@"\n',
            # A script, not a symlink: a symlinked venv interpreter would lose its venv.
            "python": f'#!/bin/sh\nexec {exe} "$@"\n',
            "python3": f'#!/bin/sh\nexec {exe} "$@"\n',
        }
        for name, text in scripts.items():
            path = bindir / name
            path.write_text(text)
            path.chmod(0o755)
        (shimdir / "ray.py").write_text(
            '"""Makes `import ray` and `import ray.util...` resolve to miniray (compat_tests)."""\n'
            "import miniray._private.core.alias as _a; _a.install(); "
            "import sys, miniray; sys.modules[__name__] = miniray\n"
        )
        return bindir, shimdir

    @staticmethod
    def _execute(result: RunResult, env: dict) -> None:
        out_path, err_path = result.workdir / "stdout.txt", result.workdir / "stderr.txt"
        shm_before = _shm_names()
        user_before = snapshot_places(user_places())
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                result.command,
                cwd=result.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        try:
            result.returncode = proc.wait(timeout=result.timeout_s)
        except subprocess.TimeoutExpired:
            result.timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            result.returncode = proc.wait()
        result.wall_s = time.monotonic() - start
        ExampleRunner._check_leaks(result, proc.pid, shm_before)
        result.leaks += [f"the user's own miniray folders gained {entry} during the run "
                         "(something ignored MINIRAY_TMPDIR or MINIRAY_HOST_DIR)"
                         for entry in gained_in_places(user_before)]
        result.stdout = strip_ansi(out_path.read_bytes().decode("utf-8", errors="replace"))
        result.stderr = strip_ansi(err_path.read_bytes().decode("utf-8", errors="replace"))

    @staticmethod
    def _check_leaks(result: RunResult, leader: int, shm_before: set) -> None:
        marker = f"MINIRAY_TMPDIR={result.tmpdir}".encode()
        ours = result.tmpdir.name
        # Segments of sessions rooted in this run's MINIRAY_TMPDIR start with mr_<root tag>;
        # other new "miniray" names belong to other sessions on the host, not to this run.
        from miniray._private.host.session import root_tag

        prefix = f"mr_{root_tag(str(result.tmpdir))}"

        def new_shm() -> list:
            return sorted(
                name for name in _shm_names() - shm_before
                if ours in name or name.startswith(prefix)
            )

        deadline = time.monotonic() + LEAK_GRACE_S
        while True:
            processes, segments = find_run_processes(leader, marker), new_shm()
            if (not processes and not segments) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if processes:
            kill_found(processes)
        for proc in processes:
            result.leaks.append(
                f"process {proc.pid} still alive {LEAK_GRACE_S:.0f} s after "
                f"the run ({proc.why}); killed: {proc.cmdline}"
            )
        for name in segments:
            if ours in name or name.startswith(prefix):
                try:
                    (SHM_DIR / name).unlink()
                    what = "removed"
                except OSError as error:
                    what = f"could not remove it: {error}"
            else:  # not reachable: only this run's names are collected
                what = "not removed"
            result.leaks.append(f"shared-memory segment {SHM_DIR / name} left behind ({what})")
        for session in sorted(result.tmpdir.glob("session_*")):
            if on_ray():  # Ray keeps its session folders (logs) by design; they are its record
                continue
            result.leaks.append(f"session directory left in MINIRAY_TMPDIR: {session}")


def _run_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Unix socket paths are limited to 107 bytes, and miniray puts session folders (which may
    # hold sockets) under MINIRAY_TMPDIR: keep it short.
    base = tmp_path_factory.getbasetemp()
    if len(str(base)) > 40:
        base = Path(tempfile.gettempdir())
    return base


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def doc_examples() -> DocExamples:
    """The doc-examples folder; call ``.require()`` in a test before using it."""
    return _doc_examples()


@pytest.fixture(scope="session")
def unsupported_examples() -> dict:
    """``unsupported.UNSUPPORTED``: example file -> the reason / issue that brings it."""
    return _load_unsupported()


@pytest.fixture(scope="session")
def run_doc_example(
    doc_examples: DocExamples, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[Any], RunResult]:
    """Run a DocCase and return its RunResult (leak checks done, leaked processes killed)."""
    runner = ExampleRunner(doc_examples, _run_base(tmp_path_factory))

    def run(case: DocCase | None) -> RunResult:
        doc_examples.require()
        assert case is not None, "bug in compat_tests: no case although the examples exist"
        return runner.run(case)

    return run


@pytest.fixture(scope="session")
def ray_import_rewriter() -> Callable[[str], tuple]:
    """The function that turns an example's ``ray`` imports into ``miniray`` imports."""
    return rewrite_ray_imports
