"""The ``miniray`` command line.

Owns: parsing the command line and running its subcommands. ``run`` is here; ``start``,
``stop`` and ``status`` come with the node (see ARCHITECTURE.md). Called by the console script
``miniray`` and by ``python -m miniray``.

``miniray run script.py [args]`` runs a program written for Ray unchanged: ``import ray`` and
every ``ray.*`` submodule resolve to miniray, in the driver and in every worker.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from miniray._private import config


def _cmd_run(args: argparse.Namespace) -> int:
    from miniray._private import alias

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
    for name in ("start", "stop", "status"):
        cmd = sub.add_parser(name, help=f"{name} a node (not implemented in this version)")
        cmd.add_argument("rest", nargs=argparse.REMAINDER)
        cmd.set_defaults(func=_not_yet, name=name)
    return parser


def _not_yet(args: argparse.Namespace) -> int:
    print(f"miniray {args.name}: nodes started from the shell are not implemented in this "
          "version; use miniray.init() in your program (it starts an embedded node).",
          file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)
