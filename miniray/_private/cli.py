"""The ``miniray`` command line.

Owns: parsing the command line, running its subcommands and what they print. The node they
start, stop and show is in ``node/node.py`` (the node process), ``node/daemon.py`` (starting
it as a daemon, stopping recorded nodes) and ``node/node_status.py`` (the status report).
Called by the console script ``miniray`` and by ``python -m miniray``.

``miniray start --head`` starts a node (ray-api-surface.md §8.1); ``miniray stop`` stops this
user's recorded nodes, by pid and start time, never by name (§8.2); ``miniray status`` prints
the nodes, their resources, GPUs and leases, reading files only (§8.3).

``miniray run script.py [args]`` runs a program written for Ray unchanged: ``import ray`` and
every ``ray.*`` submodule resolve to miniray, in the driver and in every worker.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys

from miniray._private.core import config

# Each command imports what it needs inside its function (lazy): `miniray run` must not load the
# node or the engine before the program it runs, and `status` reads files only.

def _cmd_run(args: argparse.Namespace) -> int:
    from miniray._private.core import alias  # lazy: each command loads only what it needs

    alias.install()
    os.environ[config.RAY_ALIAS_ENV] = "1"
    script = args.script
    sys.argv = [script] + list(args.args)
    if args.module:
        runpy.run_module(script, run_name="__main__", alter_sys=True)
        return 0
    if not os.path.exists(script):
        print(f"miniray run: no such file: {script}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miniray",
                                     description="Ray's core API on one host, in pure Python.")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a program written for Ray, with `ray` meaning miniray")
    run.add_argument("-m", dest="module", action="store_true", help="run a module, as python -m")
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    run.set_defaults(func=_cmd_run)
    _add_start(sub)
    stop = sub.add_parser("stop", help="stop the miniray nodes this user started")
    stop.add_argument("-f", "--force", action="store_true",
                      help="SIGKILL at once instead of SIGTERM")
    stop.add_argument("-g", "--grace-period", type=int, default=16, metavar="N",
                      help="seconds to wait after SIGTERM before SIGKILL (default 16)")
    stop.set_defaults(func=_cmd_stop)
    status = sub.add_parser("status", help="show the nodes, their resources and leases")
    status.add_argument("--address", default=None,
                        help="the node to show (default: RAY_ADDRESS, else every node)")
    status.set_defaults(func=_cmd_status)
    _add_state_commands(sub)
    return parser


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
                        help="only each driver's store statistics, no reference table")
    memory.add_argument("--num-entries", "-n", type=int, default=None,
                        help="the most references to print per driver (default: all)")
    memory.add_argument("--sort-by", choices=("PID", "OBJECT_SIZE", "REFERENCE_TYPE"),
                        default="OBJECT_SIZE",
                        help="order of each driver's references (default OBJECT_SIZE, "
                             "largest first)")
    memory.add_argument("--timeout", type=int, default=30, help=_TIMEOUT_HELP)
    memory.set_defaults(func=_cmd_memory)


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
    import os

    from miniray._private import state_api  # lazy, as above
    from miniray._private.core import state_rows

    try:
        views = state_api.gather(args.address, args.timeout)
    except (ValueError, ConnectionError, NotImplementedError, TimeoutError) as error:
        return _error(str(error))
    drivers = []
    objects: dict[int, list] = {}
    order = {"PID": lambda r: r.get("pid") or 0,
             "OBJECT_SIZE": lambda r: -(r.get("object_size") or 0),
             "REFERENCE_TYPE": lambda r: r.get("reference_type") or ""}[args.sort_by]
    for view in views:
        for doc in view.drivers:
            driver = dict(doc["driver"], session=os.path.basename(view.session_dir))
            drivers.append(driver)
            rows = [] if args.stats_only else sorted(doc["objects"], key=order)
            objects[driver["pid"]] = rows[:args.num_entries] if args.num_entries else rows
    if not drivers:
        print("No miniray driver is running.", file=sys.stderr)
        return 1
    sys.stdout.write(state_rows.format_memory(drivers, objects))
    return 0


# Options Ray users pass that configure a multi-host cluster or a dashboard: accepted, and
# named in one line, until peering exists.
_NOT_ON_ONE_HOST = (
    "include_dashboard", "dashboard_host", "dashboard_port", "node_ip_address",
    "ray_client_server_port", "labels", "labels_file", "node_name", "system_config",
)


def _add_start(sub) -> None:
    start = sub.add_parser("start", help="start a node that drivers connect to")
    start.add_argument("--head", action="store_true", help="start a head node (required)")
    start.add_argument("--address", default=None, help=argparse.SUPPRESS)
    start.add_argument("--port", type=int, default=None,
                       help="the port in the printed address (default 6379; 0: pick a free one)")
    start.add_argument("--num-cpus", type=int, default=None)
    start.add_argument("--num-gpus", type=int, default=None)
    start.add_argument("--resources", default=None, help="custom resources as JSON")
    start.add_argument("--object-store-memory", type=int, default=None, metavar="BYTES")
    start.add_argument("--memory", type=int, default=None, metavar="BYTES")
    start.add_argument("--temp-dir", default=None, help="root of the node's session directory")
    start.add_argument("--block", action="store_true", help="stay in the foreground")
    start.add_argument("--include-dashboard", default=None)
    start.add_argument("--dashboard-host", default=None)
    start.add_argument("--dashboard-port", type=int, default=None)
    start.add_argument("--node-ip-address", default=None)
    start.add_argument("--ray-client-server-port", type=int, default=None)
    start.add_argument("--disable-usage-stats", action="store_true")
    start.add_argument("--labels", default=None)
    start.add_argument("--labels-file", default=None)
    start.add_argument("--node-name", default=None)
    start.add_argument("--system-config", default=None)
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
    from miniray._private import runtime  # lazy: the CLI starts fast for `miniray --help`
    from miniray._private.ledger import inventory  # lazy: as above

    # Ray's limits, as in init(): at least 75 MiB, at most the host's memory.
    object_store_memory = runtime.check_object_store_memory(
        args.object_store_memory or None, inventory.host_memory(), inventory.shm_free(),
        config.allow_slow_storage())
    return {
        "port": args.port, "num_cpus": args.num_cpus, "num_gpus": args.num_gpus,
        "resources": resources, "object_store_memory": object_store_memory,
        "memory": args.memory, "temp_dir": args.temp_dir,
    }


def _print_started(address: str) -> None:
    print(f"Local node IP: {address.rsplit(':', 1)[0]}")
    print()
    print("--------------------")
    print("miniray runtime started.")
    print("--------------------")
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
    from miniray._private.node import daemon, node  # lazy, as above
    from miniray._private.transport import node_client

    if args.address is not None:
        return _error(
            "joining another node (`miniray start --address ...`) is not supported yet: "
            "miniray runs on one host. Start a head node with `miniray start --head`.")
    if not args.head:
        return _error("`--address` is a required flag unless starting a head node with "
                      "`--head`.")
    try:
        options = _start_options(args)
    except ValueError as error:
        return _error(str(error))
    ignored = [f"--{n.replace('_', '-')}" for n in _NOT_ON_ONE_HOST
               if getattr(args, n) is not None]
    if ignored:
        print(f"miniray: {', '.join(ignored)} do not apply on one host (no dashboard or "
              "multi-host peering yet); ignored.", file=sys.stderr)
    if not args.block:
        try:
            record, _info = daemon.spawn_daemon(options)
        except (node_client.NodeStartError, ConnectionError) as error:
            return _error(str(error))
        _print_started(record.address)
        return 0

    def ready(record, _info) -> None:
        _print_started(record.address)
        print()
        print("--block")
        print("  This command will now block until terminated by a signal (Ctrl-C, SIGTERM);")
        print("  the node's workers are stopped with it.")
        sys.stdout.flush()

    try:
        return node.run_node(options, ready, daemon=False)
    except (node_client.NodeStartError, ValueError) as error:
        return _error(str(error))


def _cmd_stop(args: argparse.Namespace) -> int:
    from miniray._private.node import daemon  # lazy, as above

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
    sys.stdout.write(node_status.format_status(views, host, time.time(), foreign))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from miniray._private.host.same_uid import InsecurePathError  # lazy: as the commands

    try:
        return args.func(args)
    except InsecurePathError as error:  # another user's root: one line, no traceback
        return _error(str(error).removeprefix("miniray "))
