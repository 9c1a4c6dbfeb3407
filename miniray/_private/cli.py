"""The ``miniray`` command line.

Owns: parsing the command line, running its subcommands and what they print. The node they
start, stop and show is in ``node/node.py`` (the node process), ``node/daemon.py`` (starting
it as a daemon, stopping recorded nodes) and ``node/node_status.py`` (the status report).
Called by the console script ``miniray`` and by ``python -m miniray``.

``miniray start --head`` starts a node (ray-api-surface.md §8.1); ``miniray stop`` stops this
user's recorded nodes, by pid and start time, never by name (§8.2); ``miniray status`` prints
the nodes, their resources, GPUs and leases, reading files only (§8.3).

``miniray logs`` prints a worker's or actor's output from the session's capped log files
(``host/worker_logs.py``). ``miniray --version`` names miniray's version and the Ray API it
mirrors. Ray's other options of these commands are accepted; those that do not apply on one
host are named in one stderr line and ignored.

``miniray get-auth-token [--generate]`` prints the cluster token hosts prove to each other
(``host/auth_token.py``), creating it first with ``--generate``.

``miniray run script.py [args]`` runs a program written for Ray unchanged: ``import ray`` and
every ``ray.*`` submodule resolve to miniray, in the driver, in every worker and in every
Python process they start (``ray_startup/sitecustomize.py``).
``miniray run --ray script.py`` is the other direction: a program written with
``import miniray as ray`` runs on real Ray, ``miniray`` meaning ``ray`` (``core/alias.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys

from miniray._private.core import config
from miniray._version import __version__

# Each command imports what it needs inside its function (lazy): `miniray run` must not load the
# node or the engine before the program it runs, and `status` reads files only.

def _cmd_run(args: argparse.Namespace) -> int:
    from miniray._private.core import alias  # lazy: each command loads only what it needs

    if args.on_ray:
        # Checked before anything changes, so a refusal leaves nothing behind.
        problem = alias.ray_missing()
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
        # The flag and ray_startup/ on PYTHONPATH reach every process the program starts.
        env = alias.on_ray_environ(os.environ)
        os.environ.pop(config.RAY_ALIAS_ENV, None)
        os.environ.update(env)
        alias.become_ray()
    else:
        alias.install()
        # The flag and ray_startup/ on PYTHONPATH: a Python process the program starts
        # (a spawn pool's child, a subprocess) resolves `import ray` the same way.
        os.environ.update(alias.forward_environ(os.environ))
    script = args.script
    sys.argv = [script] + list(args.args)
    if not args.module and not os.path.exists(script):
        print(f"miniray run: no such file: {script}", file=sys.stderr)
        return 2
    try:
        if args.module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(script)  # as `python script.py` sets __file__ (3.9+)
            sys.path.insert(0, os.path.dirname(path))
            if not _run_source(path):  # a directory, a zip file, compiled code: runpy
                runpy.run_path(script, run_name="__main__")  # names them as python does
    except Exception as error:  # SystemExit and KeyboardInterrupt pass, as under python
        from miniray._private.host.same_uid import InsecurePathError  # lazy: rare

        if isinstance(error, InsecurePathError):
            raise  # another user's root: main() prints it as one line, no traceback
        # The program's traceback as `python script.py` prints it: from its own first
        # frame, without this launcher's and runpy's (Python prints the exception's own
        # traceback, whatever the hook is given: both are set).
        frames = _program_frames(error.__traceback__)
        if frames is None and not isinstance(error, SyntaxError):
            frames = error.__traceback__  # the launcher's own error: all of it
        # (A SyntaxError in the program's text has no frame of it: printed alone.)
        sys.excepthook(type(error), error.with_traceback(frames), frames)
        return 1
    return 0


def _run_source(path: str) -> bool:
    """Run the Python source file ``path`` as the ``__main__`` module, as ``python path``
    does: ``__file__`` is ``path``, ``__spec__`` None, the loader a source loader
    (``runpy.run_path`` would also set ``sys.argv[0]`` to ``path``). False, having run
    nothing, when ``path`` is not a file of source text (a NUL byte: a zip application or
    compiled code, which runpy runs)."""
    import builtins  # lazy: each command loads only what it needs
    import importlib.machinery
    import types

    if not os.path.isfile(path):
        return False
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    source = loader.get_data(path)
    if b"\0" in source:
        return False
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __spec__=None,
                         __builtins__=builtins)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
    return True


def _program_frames(tb):
    """``tb`` without its leading frames of this file and of runpy; None when the program
    has no frame in it."""
    launcher = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
    first = tb
    while first is not None and (first.tb_frame.f_code.co_filename in launcher or
                                 os.path.abspath(first.tb_frame.f_code.co_filename)
                                 in launcher):
        first = first.tb_next
    return first


def _cmd_get_auth_token(args: argparse.Namespace) -> int:
    """Ray's ``ray get-auth-token [--generate]``: the token on stdout, from the sources of
    ``host/auth_token.py``; where it came from on stderr only when it was just made."""
    from miniray._private.host import auth_token  # lazy: each command loads only what it needs

    existed = True
    if args.generate:
        try:
            auth_token.load_token()
        except auth_token.AuthTokenError:
            existed = False
    try:
        token = auth_token.load_token(create=args.generate)
    except auth_token.AuthTokenError as error:
        return _error(str(error))
    print(token.decode(errors="replace"))
    if not existed:
        print(f"miniray: made a new cluster token in {auth_token.token_source()}",
              file=sys.stderr)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miniray",
                                     description="Ray's core API on one host, in pure Python.")
    # Ray prints "ray, version 2.60.0"; this names miniray's version and the API it mirrors.
    parser.add_argument("--version", "-V", action="version",
                        version=f"miniray, version {__version__} (mirrors Ray {RAY_API}'s API)",
                        help="print miniray's version and the Ray version whose API it "
                             "mirrors, then exit")
    _add_ignored(parser, _RAY_CLI_OPTIONS, "the logging of Ray's own processes")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a program written for Ray, with `ray` meaning miniray")
    run.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    run.add_argument("--ray", dest="on_ray", action="store_true",
                     help="the other direction: run a program written with `import miniray as "
                          "ray` on real Ray (installed separately), `miniray` meaning `ray`")
    run.add_argument("script", help="the program to run (a module name with -m)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the program's own arguments")
    run.set_defaults(func=_cmd_run)
    _add_start(sub)
    token = sub.add_parser("get-auth-token",
                           help="print the cluster token that hosts prove to each other")
    token.add_argument("--generate", action="store_true",
                       help="create the token (into ~/.miniray/auth_token, or the file "
                            "MINIRAY_AUTH_TOKEN_PATH names) if there is none yet")
    token.set_defaults(func=_cmd_get_auth_token)
    stop = sub.add_parser("stop", help="stop the miniray nodes this user started")
    stop.add_argument("-f", "--force", action="store_true",
                      help="SIGKILL at once instead of SIGTERM")
    stop.add_argument("-g", "--grace-period", type=int, default=16, metavar="N",
                      help="seconds to wait after SIGTERM before SIGKILL (default 16)")
    _add_ignored(stop, _RAY_LOG_OPTIONS, "miniray's CLI has one output style")
    stop.set_defaults(func=_cmd_stop)
    status = sub.add_parser("status", help="show the nodes, their resources and leases")
    status.add_argument("--address", default=None,
                        help="the node to show (default: RAY_ADDRESS, else every node)")
    status.add_argument("-v", "--verbose", action="store_true",
                        help="also list the demands: what each driver has queued, waiting "
                             "for resources, by function name and resource shape")
    status.set_defaults(func=_cmd_status)
    _add_logs(sub)
    _add_state_commands(sub)
    _add_dashboard(sub)
    return parser


def _add_dashboard(sub) -> None:
    dash = sub.add_parser(
        "dashboard", help="serve a local web page showing the live sessions",
        description="Serves one page (nodes, resources, GPUs, tasks, actors, object stores, "
                    "a timeline) on 127.0.0.1, protected by a token printed in its URL. "
                    "Stops on Ctrl-C or SIGTERM.")
    dash.add_argument("--host", default=None,
                      help="address to bind (default 127.0.0.1; another needs --allow-remote)")
    dash.add_argument("--port", type=int, default=None,
                      help="port to listen on (default 8265, as Ray's; 0: any free port)")
    dash.add_argument("--allow-remote", action="store_true",
                      help="allow a non-loopback --host (the token is still required)")
    dash.add_argument("--address", default=None, help=_ADDRESS_HELP)
    # Set by `miniray start --include-dashboard`: the node's session, where the dashboard
    # records its pid for `miniray stop`.
    dash.add_argument("--record-dir", default=None, metavar="SESSION_DIR",
                      help="record this process's pid in SESSION_DIR for `miniray stop` "
                           "(set by `miniray start --include-dashboard`)")
    dash.set_defaults(func=_cmd_dashboard)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from miniray._private.node import dashboard  # lazy, as above

    host = args.host or dashboard.DEFAULT_HOST
    port = dashboard.DEFAULT_PORT if args.port is None else args.port
    if not 0 <= port < 65536:
        return _error(f"--port must be in 0..65535, got {port}.")
    problem = dashboard.check_host(host, args.allow_remote)
    if problem is not None:
        return _error(problem)

    def ready(url: str) -> None:
        # One write: `miniray start --include-dashboard` reads the first line and closes.
        sys.stdout.write(f"miniray dashboard: {url}\n(the token in this URL is the only way "
                         "in; press Ctrl-C to stop)\n")
        sys.stdout.flush()

    try:
        return dashboard.run(host, port, args.address, ready, args.record_dir)
    except OSError as error:  # the port is taken, the address is not ours, ...
        return _error(f"cannot serve the dashboard on {host}:{port}: {error.strerror or error}"
                      + (". Pick another with --port (0: any free port)."
                         if error.errno == 98 else "."))


_LIST_RESOURCES = ("actors", "tasks", "objects", "nodes", "workers", "jobs", "placement-groups")
_GET_RESOURCES = ("actors", "tasks", "objects", "nodes", "workers", "jobs", "placement-groups")
_ADDRESS_HELP = ("the node (host:port) or session directory to read (default: RAY_ADDRESS, "
                 "else every live miniray session of this user on this host)")
_TIMEOUT_HELP = "seconds to wait for each driver's answer (default 30)"


def _add_state_commands(sub) -> None:
    """``miniray list|get|summary|memory``: Ray's state CLI, with Ray's options."""
    lister = sub.add_parser("list", help="list tasks, actors, objects, nodes, workers, jobs or "
                                         "placement groups (as `ray list`)")
    lister.add_argument("resource", choices=_LIST_RESOURCES, help="what to list")
    lister.add_argument("-f", "--filter", action="append", default=[], metavar="KEY=VALUE",
                        help="keep rows where KEY=VALUE or KEY!=VALUE (repeatable; strings "
                             "compare without case), e.g. --filter state=RUNNING")
    lister.add_argument("--limit", type=int, default=100,
                        help="the most rows to print (default 100)")
    lister.add_argument("--detail", action="store_true",
                        help="every column, not only the default ones")
    lister.add_argument("--format", choices=("default", "json", "yaml", "table"),
                        default="default", help="output format (default: a table)")
    lister.add_argument("--address", default=None, help=_ADDRESS_HELP)
    lister.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    lister.set_defaults(func=_cmd_list)
    getter = sub.add_parser("get", help="one task, actor, object, node, worker or job by id "
                                        "(as `ray get`)")
    getter.add_argument("resource", choices=_GET_RESOURCES, help="what to get")
    getter.add_argument("id", help="its id (hex, as `miniray list` prints it)")
    getter.add_argument("--format", choices=("default", "json", "yaml"), default="default",
                        help="output format (default: YAML)")
    getter.add_argument("--address", default=None, help=_ADDRESS_HELP)
    getter.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    getter.set_defaults(func=_cmd_get)
    summary = sub.add_parser("summary", help="tasks, actors or objects counted by name and "
                                             "state (as `ray summary`)")
    summary.add_argument("resource", choices=("tasks", "actors", "objects"),
                         help="what to summarize")
    summary.add_argument("--address", default=None, help=_ADDRESS_HELP)
    summary.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    summary.set_defaults(func=_cmd_summary)
    memory = sub.add_parser("memory", help="object references per driver with their sizes "
                                           "(as `ray memory`)")
    memory.add_argument("--address", default=None, help=_ADDRESS_HELP)
    memory.add_argument("--stats-only", action="store_true",
                        help="only the stores' totals, no reference table")
    memory.add_argument("--group-by", choices=("NODE_ADDRESS", "STACK_TRACE"),
                        default="NODE_ADDRESS",
                        help="accepted as in Ray; references are grouped by driver either way")
    memory.add_argument("--units", choices=("B", "KB", "MB", "GB"), default="B",
                        help="the unit of the sizes (default B)")
    memory.add_argument("--num-entries", "-n", type=int, default=None,
                        help="the most references to print per driver (default: all)")
    memory.add_argument("--sort-by", choices=("PID", "OBJECT_SIZE", "REFERENCE_TYPE"),
                        default="OBJECT_SIZE",
                        help="order of each driver's references (default OBJECT_SIZE, "
                             "largest first)")
    memory.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    memory.set_defaults(func=_cmd_memory)
    timeline = sub.add_parser("timeline", help="write the finished tasks and actor calls of "
                                               "the live drivers as a Chrome trace "
                                               "(as `ray timeline`)")
    timeline.add_argument("file", nargs="?", default=None,
                          help="where to write it (default: ray-timeline-<date>_<time>.json "
                               "in the current directory)")
    timeline.add_argument("--address", default=None, help=_ADDRESS_HELP)
    timeline.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    timeline.set_defaults(func=_cmd_timeline)


def _cmd_timeline(args: argparse.Namespace) -> int:
    import datetime

    from miniray._private import state_api  # lazy, as above

    try:
        events = state_api.timeline(args.address, args.timeout)
    except (ValueError, ConnectionError, TimeoutError) as error:
        return _error(str(error))
    # Ray's name; written here rather than in the session root, which is memory-backed and
    # removed with the last session.
    path = args.file or datetime.datetime.today().strftime("ray-timeline-%Y-%m-%d_%H-%M-%S.json")
    try:
        with open(path, "w") as out:
            json.dump(events, out)
    except OSError as error:
        return _error(f"cannot write the trace to {path}: {error}")
    print(f"Trace file written to {path} ({sum(e['ph'] == 'X' for e in events)} events).")
    print("You can open this with chrome://tracing in the Chrome browser, or in "
          "https://ui.perfetto.dev.")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from miniray._private import state_api  # lazy, as above
    from miniray._private.core import state_rows

    resource = args.resource.replace("-", "_")
    try:
        filters = [state_rows.parse_filter(text) for text in args.filter]
        found = state_api.list_resource(resource, args.address, filters, args.limit,
                                        args.timeout, args.detail, False)
    except (ValueError, ConnectionError, NotImplementedError, TimeoutError) as error:
        return _error(str(error))
    print(state_rows.format_list(resource, found, args.format, args.detail))
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    from miniray._private import state_api  # lazy, as above
    from miniray._private.core import state_rows

    resource = args.resource.replace("-", "_")
    try:
        if resource == "objects":
            found = state_api.list_resource(resource, args.address,
                                            [("object_id", "=", args.id)], None,
                                            args.timeout, True, False)
        else:
            row = state_api.get_resource(resource, args.id, args.address, args.timeout)
            found = [row] if row is not None else []
    except (ValueError, ConnectionError, NotImplementedError, TimeoutError) as error:
        return _error(str(error))
    print(state_rows.format_get(found, args.id, args.format))
    return 0 if found else 1


def _cmd_summary(args: argparse.Namespace) -> int:
    from miniray._private import state_api  # lazy, as above
    from miniray._private.core import state_rows

    try:
        doc = state_api.summarize(args.resource, args.address, args.timeout, False)
    except (ValueError, ConnectionError, NotImplementedError, TimeoutError) as error:
        return _error(str(error))
    print(state_rows.format_summary(args.resource, doc))
    return 0


def _cmd_memory(args: argparse.Namespace) -> int:
    from miniray._private import state_api  # lazy, as above

    try:
        text = state_api.memory(args.address, args.timeout, group_by=args.group_by,
                                sort_by=args.sort_by, units=args.units,
                                stats_only=args.stats_only, num_entries=args.num_entries)
    except (ValueError, ConnectionError, NotImplementedError, TimeoutError) as error:
        return _error(str(error))
    if text is None:
        print("No miniray driver is running.", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def _add_logs(sub) -> None:
    logs = sub.add_parser(
        "logs", help="print a worker's or an actor's output, kept in the session's logs/",
        description="A worker's or actor's output: `miniray logs --pid N`, `miniray logs "
                    "--actor-id HEX`, or as in Ray `miniray logs worker --pid N`, `miniray "
                    "logs actor --id HEX`, `miniray logs worker-N.out`; with no argument, "
                    "the log files of every session.")
    logs.add_argument("what", nargs="?", default=None, metavar="worker|actor|cluster|FILE",
                      help="Ray's subcommand (worker, actor, cluster) or a log file's name "
                           "(worker-<pid>.out or .err)")
    logs.add_argument("file", nargs="?", default=None, metavar="FILE",
                      help="with `cluster`: the log file's name")
    logs.add_argument("-pid", "--pid", type=int, default=None,
                      help="the worker's (or actor's) process id")
    logs.add_argument("-a", "--id", "--actor-id", dest="actor_id", default=None,
                      metavar="HEX", help="the actor's id (hex, as ActorID.hex())")
    logs.add_argument("--err", action="store_true",
                      help="the stderr log instead of the stdout one")
    logs.add_argument("--tail", type=int, default=1000, metavar="N",
                      help="print the last N lines (default 1000, as Ray; -1: all)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing what is written until Ctrl-C")
    logs.add_argument("--address", default=None,
                      help="the node whose session to read (default: every session)")
    logs.add_argument("-id", "--node-id", default=None, metavar="HEX",
                      help="read on this node; another host's is asked over its port")
    logs.add_argument("-ip", "--node-ip", default=None, metavar="IP",
                      help="read on the node at this IP, as --node-id")
    _add_ignored(logs, _RAY_LOGS_OPTIONS, "one host, files read directly")
    logs.set_defaults(func=_cmd_logs)


# The Ray version whose API miniray mirrors (printed by --version).
RAY_API = "2.60"

# Ray's options that miniray accepts and ignores, as (flags, takes a value).
# Ray's top-level `ray` command takes these before the subcommand.
_RAY_CLI_OPTIONS = (
    (("--logging-level",), True), (("--logging-format",), True),
)
# `ray stop` (and every Ray command that logs with Ray's cli_logger).
_RAY_LOG_OPTIONS = (
    (("--log-style",), True), (("--log-color",), True), (("-v", "--verbose"), False),
)
# `ray logs` options that select a node or shape the API request.
_RAY_LOGS_OPTIONS = (
    (("--timeout",), True), (("--interval",), True), (("--encoding",), True),
    (("--encoding-errors",), True),
)
# `ray start` (Ray 2.60's whole list, hidden options included) less those miniray honours:
# they configure ports, the dashboard's agents, several hosts, Redis, cgroups or log styling.
_RAY_START_OPTIONS = (
    (("--node-name",), True), (("--redis-username",), True),
    (("--redis-password",), True), (("--redis-shard-ports",), True),
    (("--object-manager-port",), True), (("--node-manager-port",), True),
    (("--min-worker-port",), True), (("--max-worker-port",), True),
    (("--worker-port-list",), True), (("--ray-client-server-port",), True),
    (("--dashboard-agent-listen-port",), True),
    (("--dashboard-agent-grpc-port",), True), (("--runtime-env-agent-port",), True),
    (("--plasma-directory",), True), (("--object-spilling-directory",), True),
    (("--autoscaling-config",), True), (("--no-redirect-output",), False),
    (("--system-config",), True), (("--enable-object-reconstruction",), False),
    (("--metrics-export-port",), True), (("--no-monitor",), False),
    (("--tracing-startup-hook",), True), (("--ray-debugger-external",), False),
    (("--labels",), True), (("--labels-file",), True), (("--include-log-monitor",), True),
    (("--enable-resource-isolation",), False), (("--system-reserved-cpu",), True),
    (("--system-reserved-memory",), True), (("--cgroup-path",), True),
    (("--proxy-server-url",), True),
) + _RAY_LOG_OPTIONS


def _dest(flags: tuple) -> str:
    return flags[-1].lstrip("-").replace("-", "_")


def _add_ignored(parser: argparse.ArgumentParser, options: tuple, why: str) -> None:
    """Add Ray's ``options`` to ``parser``, marked in their help as accepted and ignored."""
    for flags, takes_value in options:
        text = f"Ray's; accepted and ignored ({why})"
        if takes_value:
            parser.add_argument(*flags, dest=_dest(flags), default=None, metavar="VALUE",
                                help=text)
        else:
            parser.add_argument(*flags, dest=_dest(flags), action="store_const", const=True,
                                default=None, help=text)


_IGNORED_WHY = "do not apply on one host (no Ray agents, ports or Ray's log styling)"
_START_IGNORED_WHY = (
    "do not apply to a miniray node (it runs no Ray agents, raylet, GCS or autoscaler and "
    "listens on --port only; other hosts join it with `miniray start --address`; node "
    "names and labels are not settable, and logs have one style)")


def _warn_ignored(args: argparse.Namespace, options: tuple, why: str = _IGNORED_WHY) -> None:
    """One stderr line naming the Ray options given that miniray ignores, and why."""
    given = [flags[-1] for flags, _takes in options
             if getattr(args, _dest(flags), None) is not None]
    if given:
        print(f"miniray: {', '.join(given)} {why}; ignored.", file=sys.stderr)


def _add_start(sub) -> None:
    start = sub.add_parser("start", help="start a node that drivers connect to")
    start.add_argument("--head", action="store_true", help="start a head node")
    start.add_argument("--address", default=None, metavar="HEAD_IP:PORT",
                       help="join the cluster of the head node at this address (needs the "
                            "head's token: `miniray get-auth-token` there)")
    start.add_argument("--port", type=int, default=None,
                       help="the TCP port the node listens on (default 6379; 0: pick a free "
                            "one)")
    start.add_argument("--node-ip-address", default=None, metavar="IP",
                       help="the address the node listens on and is known by (default "
                            "127.0.0.1; never all interfaces unless named)")
    start.add_argument("--num-cpus", type=int, default=None,
                       help="CPUs of the node (default: the host's)")
    start.add_argument("--num-gpus", type=int, default=None,
                       help="GPUs of the node (default: those detected)")
    start.add_argument("--resources", default=None,
                       help="custom resources as a JSON object, e.g. '{\"accel\": 2}'")
    start.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES",
                       help="object store capacity (default: 30%% of available memory)")
    start.add_argument("--memory", type=int, default=None, metavar="BYTES",
                       help="the node's `memory` resource, in bytes")
    start.add_argument("--temp-dir", default=None, help="root of the node's session directory")
    start.add_argument("--block", action="store_true", help="stay in the foreground")
    # Ray's; its effect is miniray's only behaviour, so it is accepted without a word.
    start.add_argument("--disable-usage-stats", action="store_true",
                       help="Ray's; accepted (miniray never collects usage statistics)")
    start.add_argument("--include-dashboard", default=None, metavar="BOOLEAN",
                       help="also run `miniray dashboard` for this node (true/false; default: "
                            "only when --dashboard-host or --dashboard-port is given); "
                            "`miniray stop` stops it")
    start.add_argument("--dashboard-host", default=None,
                       help="the dashboard's address (default 127.0.0.1; loopback only)")
    start.add_argument("--dashboard-port", type=int, default=None,
                       help="the dashboard's port (default 8265; 0: any free port)")
    _add_ignored(start, _RAY_START_OPTIONS,
                 "no Ray agents, per-service ports, node names, labels or Ray's log "
                 "styling")
    start.set_defaults(func=_cmd_start)


def _error(message: str) -> int:
    print(f"miniray: {message}", file=sys.stderr)
    return 1


def _start_options(args: argparse.Namespace) -> dict:
    """The node's options from the command line; ValueError with Ray's message if invalid."""
    resources = None
    if args.resources is not None:
        bad = f"--resources must be a JSON object, got {args.resources!r}."
        try:
            resources = json.loads(args.resources)
        except ValueError:
            raise ValueError(bad) from None
        if not isinstance(resources, dict):
            raise ValueError(bad)
        for reserved in ("CPU", "GPU"):
            if reserved in resources:
                raise ValueError("Use the '--num-cpus' and '--num-gpus' keywords instead of "
                                 f"'CPU' and 'GPU' in '--resources' (got {reserved!r}).")
        for name, value in resources.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"--resources: {name!r} must be a number >= 0, got {value!r}.")
    for name in ("num_cpus", "num_gpus", "object_store_memory", "memory"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}.")
    if args.port is not None and not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}.")
    object_store_memory = None
    if args.object_store_memory:
        from miniray._private.core.resources import check_object_store_memory  # lazy: as above
        from miniray._private.ledger import inventory  # lazy: as above

        # Ray's limits, as in init(): at least 75 MiB, at most the host's memory.
        object_store_memory = check_object_store_memory(
            args.object_store_memory, inventory.host_memory(), inventory.shm_free(),
            config.allow_slow_storage())
    return {
        "port": args.port, "num_cpus": args.num_cpus, "num_gpus": args.num_gpus,
        "resources": resources, "object_store_memory": object_store_memory,
        "memory": args.memory, "temp_dir": args.temp_dir,
    }


def _node_ip(value: str) -> str:
    """``--node-ip-address``: an IP address (never a wildcard); ValueError otherwise."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"--node-ip-address must be an IP address, got {value!r}.") from None
    if ip.is_unspecified:
        raise ValueError(f"--node-ip-address {value} would listen on every interface; name "
                         "the address of this host that the other nodes reach.")
    return str(ip)


def _print_started(address: str, head: str | None = None) -> None:
    print(f"Local node IP: {address.rsplit(':', 1)[0]}")
    print()
    print("--------------------")
    print("miniray runtime started.")
    print("--------------------")
    print()
    if head is None:
        print("  To add another host to this cluster, copy the token (`miniray get-auth-token`")
        print("  here) to MINIRAY_AUTH_TOKEN there, then run there")
        print(f"    miniray start --address='{address}' --node-ip-address=<its IP>")
        print()
    else:
        print(f"  This node joined the cluster of the head at {head}.")
        print()
    print("Next steps")
    print("  To connect to this miniray runtime from a program on this host, use")
    print("    import ray            # under `miniray run`, or: import miniray as ray")
    print("    ray.init()")
    print(f"  or ray.init(address='auto'), ray.init(address='{address}'), or the")
    print(f"  RAY_ADDRESS={address} environment variable.")
    print()
    print("  To terminate the miniray runtime, run")
    print("    miniray stop")
    print()
    print("  To view the status of the cluster, use")
    print("    miniray status")
    sys.stdout.flush()


def _cmd_start(args: argparse.Namespace) -> int:
    # lazy, as above; and only what comes before the node is launched (core/node_start.py)
    from miniray._private.core.node_start import NodeStartError, parse_address
    from miniray._private.host import auth_token
    from miniray._private.node import daemon

    if args.address is not None and args.head:
        return _error("`--head` starts a new cluster and `--address` joins one: give one "
                      "of them.")
    if args.address is None and not args.head:
        return _error("`--address` is a required flag unless starting a head node with "
                      "`--head`.")
    try:
        options = _start_options(args)
        if args.address is not None:
            options["head_address"] = "{}:{}".format(*parse_address(args.address))
        if args.node_ip_address is not None:
            options["node_ip"] = _node_ip(args.node_ip_address)
    except ValueError as error:
        return _error(str(error))
    try:  # the head creates the cluster's token once; a member must be given it
        auth_token.load_token(create=args.head)
    except auth_token.AuthTokenError as error:
        if args.head:
            return _error(str(error))
        return _error(f"{error} A node joins a cluster with its head's token: run `miniray "
                      "get-auth-token` on the head and set MINIRAY_AUTH_TOKEN to it here "
                      "(or a 0600 file named by MINIRAY_AUTH_TOKEN_PATH).")
    try:
        dashboard = _dashboard_options(args)
    except ValueError as error:
        return _error(str(error))
    _warn_ignored(args, _RAY_START_OPTIONS, _START_IGNORED_WHY)
    if not args.block:
        try:
            record, _info = daemon.spawn_daemon(options)
        except (NodeStartError, ConnectionError) as error:
            return _error(str(error))
        _print_started(record.address, record.head_address or None)
        if dashboard is not None:
            try:
                url = daemon.spawn_dashboard(record, *dashboard)
            except NodeStartError as error:
                return _error(f"the node runs, but {error} (`miniray stop` stops the node)")
            print()
            print(f"  To view the dashboard, open (the token is its only key)\n    {url}")
            sys.stdout.flush()
        return 0
    if dashboard is not None:
        return _error("--include-dashboard is not supported with --block: run `miniray "
                      "dashboard` beside it.")

    def ready(record, _info) -> None:
        _print_started(record.address, record.head_address or None)
        print()
        print("--block")
        print("  This command will now block until terminated by a signal (Ctrl-C, SIGTERM);")
        print("  the node's workers are stopped with it.")
        sys.stdout.flush()

    from miniray._private.node import node  # lazy: only --block runs the node in this process

    try:
        return node.run_node(options, ready, daemon=False)
    except (NodeStartError, ValueError) as error:
        return _error(str(error))


_TRUE = ("true", "t", "yes", "y", "1", "on")
_FALSE = ("false", "f", "no", "n", "0", "off")


def _dashboard_options(args: argparse.Namespace) -> tuple[str, int] | None:
    """``(host, port)`` of the dashboard `miniray start` runs, or None; ValueError if bad."""
    include = args.include_dashboard
    if include is not None:
        if include.lower() not in _TRUE + _FALSE:
            raise ValueError(f"--include-dashboard takes true or false, got {include!r}.")
        wanted = include.lower() in _TRUE
    else:  # Ray starts its dashboard by default; miniray when its place is named
        wanted = args.dashboard_host is not None or args.dashboard_port is not None
    if not wanted:
        return None
    host = args.dashboard_host or "127.0.0.1"
    host = "127.0.0.1" if host == "localhost" else host
    port = 8265 if args.dashboard_port is None else args.dashboard_port
    if not 0 <= port < 65536:
        raise ValueError(f"--dashboard-port must be in 0..65535, got {port}.")
    from miniray._private.core import dashboard_model  # lazy: only this option needs it

    if not dashboard_model.is_loopback(host):
        raise ValueError(f"--dashboard-host {host} would let other hosts reach the "
                         "dashboard; `miniray start` binds loopback only. Run `miniray "
                         "dashboard --host HOST --allow-remote` to accept that.")
    return host, port


def _cmd_stop(args: argparse.Namespace) -> int:
    from miniray._private.node import daemon  # lazy, as above

    _warn_ignored(args, _RAY_LOG_OPTIONS)
    stopped = daemon.stop_nodes(force=args.force, grace=float(args.grace_period))
    if stopped:
        print(f"Stopped {stopped} miniray node(s).")
    else:
        print("Did not find any active miniray nodes.")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import time

    from miniray._private.node import node_status  # lazy, as above
    from miniray._private.transport import node_client

    address = args.address or os.environ.get("RAY_ADDRESS") or None
    try:
        if address is None:
            records = node_client.list_records()
        else:
            record = node_client.find_node(address)
            records = [record] if record is not None else []
    except (ValueError, ConnectionError, NotImplementedError) as error:
        return _error(str(error))
    foreign = node_status.collect_foreign(config.tmpdir_root())
    # Sessions of init() (the driver is the node) are shown too, unless one node was named.
    embedded = node_status.collect_embedded(config.tmpdir_root()) if address is None else []
    if not records and not embedded:
        print("No miniray node is running. Start one with `miniray start --head` (a program "
              "that calls init() shows here too while it runs).", file=sys.stderr)
        line = node_status.foreign_line(foreign)
        if line:
            print(line, file=sys.stderr)
        return 1
    views, host = node_status.collect(records)
    views += embedded
    sys.stdout.write(node_status.format_status(views, host, time.time(), foreign,
                                               verbose=args.verbose))
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from miniray._private.host import worker_logs  # lazy, as above
    from miniray._private.transport import node_client

    _warn_ignored(args, _RAY_LOGS_OPTIONS)
    if args.node_id is not None or args.node_ip is not None:
        return _node_logs(args)
    try:
        if args.address is not None:
            record = node_client.find_node(args.address)
            if record is None:
                return _error(f"no miniray node at {args.address}.")
            sessions = [record.session_dir]
        else:
            sessions = worker_logs.session_dirs(
                config.tmpdir_root(), [r.session_dir for r in node_client.list_records()])
    except (ValueError, ConnectionError, NotImplementedError) as error:
        return _error(str(error))
    what, name = args.what, args.file
    if what == "cluster":
        what = name
    elif what in ("worker", "actor") and name is not None:
        return _error(f"`miniray logs {what}` takes --pid or --id, not {name!r}.")
    if what not in (None, "worker", "actor"):  # a file name, as `ray logs worker-N.out`
        paths = worker_logs.find_named(sessions, what)
        if not paths:
            return _error(f"no log file named {what!r} in {_where(sessions)}. "
                          "`miniray logs` lists them.")
        if len({p.removesuffix(".1") for p in paths}) > 1:  # as Ray: several match, list them
            sys.stdout.write("".join(f"{p}\n" for p in paths if not p.endswith(".1")))
            return 0
        return _print_logs(paths, args)
    if args.actor_id is not None:
        found = worker_logs.find_actor_pids(sessions, args.actor_id.lower())
        if not found or not found[1]:
            return _error(f"no log of actor {args.actor_id} in {_where(sessions)} (actors "
                          "of a session that has ended leave none).")
        session_dir, pids = found
        paths = [p for pid in pids
                 for p in worker_logs.find_worker_logs([session_dir], pid, args.err)]
        return _print_logs(paths, args)
    if args.pid is not None:
        paths = worker_logs.find_worker_logs(sessions, args.pid, args.err)
        if not paths:
            return _error(f"no log of worker pid {args.pid} in {_where(sessions)}: it is not "
                          "a worker of a live session, it printed nothing, or "
                          "MINIRAY_WORKER_LOG_BYTES=0.")
        return _print_logs(paths, args)
    if what is not None:
        return _error(f"`miniray logs {what}` needs --pid N" +
                      (" or --id HEX." if what == "actor" else "."))
    listing = worker_logs.listing(sessions)
    if not listing:
        print(f"No log files in {_where(sessions)}.", file=sys.stderr)
        return 1
    sys.stdout.write(listing)
    return 0


def _node_logs(args: argparse.Namespace) -> int:
    """``--node-id`` / ``--node-ip``: through the state API, which asks another host's node
    over its port (``remote_drivers.py`` step 13) and reads this host's files itself."""
    from miniray._private import state_api  # lazy, as above

    what, name = args.what, args.file
    if what == "cluster":
        what = name
    filename = what if what not in (None, "worker", "actor") else None
    try:
        if args.follow:  # the tail, then what is appended, until interrupted
            for text in state_api.follow_log(
                    args.address, filename, args.actor_id, None, args.pid, args.tail,
                    "err" if args.err else "out", node_id=args.node_id,
                    node_ip=args.node_ip):
                sys.stdout.write(text)
                sys.stdout.flush()
            return 0
        if filename is None and args.actor_id is None and args.pid is None:
            found = state_api.list_logs(args.address, None, args.node_id, args.node_ip)
            names = sorted(n for kind in found.values() for n in kind)
            if not names:
                print("No log files on that node.", file=sys.stderr)
                return 1
            sys.stdout.write("".join(f"{n}\n" for n in names))
            return 0
        sys.stdout.write(state_api.get_log(
            args.address, filename, args.actor_id, None, args.pid, args.tail,
            "err" if args.err else "out", node_id=args.node_id, node_ip=args.node_ip))
        return 0
    except (ValueError, state_api.RayStateApiException) as error:
        return _error(str(error))
    except KeyboardInterrupt:  # how a follow ends
        return 0


def _where(sessions: list) -> str:
    return f"{len(sessions)} session(s) under {config.tmpdir_root()}" if sessions \
        else f"no session under {config.tmpdir_root()}"


def _print_logs(paths: list, args: argparse.Namespace) -> int:
    from miniray._private.host import worker_logs  # lazy, as above

    if not args.follow:
        sys.stdout.write(worker_logs.read_text(paths, args.tail))
        return 0
    try:  # the tail, then what is written later, across rotations
        for text in worker_logs.follow(lambda: paths, args.tail, 0.25):
            sys.stdout.write(text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _warn_ignored(args, _RAY_CLI_OPTIONS)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from miniray._private.host.same_uid import InsecurePathError  # lazy: as the commands

    try:
        return args.func(args)
    except InsecurePathError as error:  # another user's root: one line, no traceback
        return _error(str(error).removeprefix("miniray "))
