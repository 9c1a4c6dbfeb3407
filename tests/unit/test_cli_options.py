"""The ``miniray`` command's options: ``--version``, help for every option, and Ray's options
accepted and ignored (``cli.py``), checked on the parser without starting processes.

The lists of Ray's options below were read from Ray 2.60's ``ray start --help``, ``ray stop
--help``, ``ray status --help`` and its hidden options (``ray/scripts/scripts.py``).
"""

from __future__ import annotations

import argparse

import pytest

from miniray._private import cli
from miniray._version import __version__

RAY_START = (
    "--node-ip-address=1.2.3.4 --address=x --port=1 --node-name=n --redis-username=u "
    "--redis-password=p --redis-shard-ports=1 --object-manager-port=1 --node-manager-port=1 "
    "--min-worker-port=1 --max-worker-port=2 --worker-port-list=1,2 "
    "--ray-client-server-port=1 --memory=1 --object-store-memory=1 --num-cpus=1 "
    "--num-gpus=0 --resources={} --head --include-dashboard=false --dashboard-host=h "
    "--dashboard-port=1 --dashboard-agent-listen-port=1 --dashboard-agent-grpc-port=1 "
    "--runtime-env-agent-port=1 --block --plasma-directory=/p --object-spilling-directory=/s "
    "--autoscaling-config=a --no-redirect-output --temp-dir=/t --system-config={} "
    "--enable-object-reconstruction --metrics-export-port=1 --no-monitor "
    "--tracing-startup-hook=h --ray-debugger-external --disable-usage-stats --labels={} "
    "--labels-file=f --include-log-monitor=true --enable-resource-isolation "
    "--system-reserved-cpu=1 --system-reserved-memory=1 --cgroup-path=/c "
    "--proxy-server-url=u --log-style=record --log-color=false -v"
).split()


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parsers():
    top = cli._parser()
    return [("miniray", top)] + [(f"miniray {n}", p) for n, p in _subparsers(top).items()]


def test_every_option_of_every_command_has_help():
    for name, parser in _parsers():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help != argparse.SUPPRESS, \
                f"{name}: {action.option_strings or action.dest} has no help"


def test_ignored_options_say_so_in_their_help():
    start = _subparsers(cli._parser())["start"]
    helps = {opt: a.help for a in start._actions for opt in a.option_strings}
    for opt in ("--dashboard-agent-listen-port", "--redis-password",
                "--no-monitor", "--log-style", "--system-config"):
        assert "accepted and ignored" in helps[opt], opt
    for opt in ("--num-cpus", "--port", "--resources", "--block", "--temp-dir",
                "--node-ip-address", "--address",
                "--include-dashboard", "--dashboard-host", "--dashboard-port"):
        assert "ignored" not in helps[opt], opt


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_miniray_and_the_ray_api_it_mirrors(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli._parser().parse_args([flag])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == \
        f"miniray, version {__version__} (mirrors Ray 2.60's API)"


def test_every_ray_start_option_is_accepted_and_ignored_ones_are_named_once(capsys):
    args = cli._parser().parse_args(["start"] + RAY_START)
    assert (args.num_cpus, args.port, args.head, args.block, args.temp_dir) == \
        (1, 1, True, True, "/t")
    cli._warn_ignored(args, cli._RAY_START_OPTIONS)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith("ignored.")
    for flag in ("--dashboard-agent-grpc-port", "--no-monitor",
                 "--verbose", "--proxy-server-url", "--log-color"):
        assert flag in err[0]
    for honoured in ("--num-cpus", "--temp-dir", "--disable-usage-stats", "--node-ip-address",
                     "--include-dashboard", "--dashboard-port", "--dashboard-host"):
        assert honoured not in err[0]


def test_ray_stop_and_status_options_are_accepted(capsys):
    args = cli._parser().parse_args(["stop", "-f", "-g", "3", "--log-style", "pretty",
                                     "--log-color", "true", "-v"])
    assert (args.force, args.grace_period) == (True, 3)
    cli._warn_ignored(args, cli._RAY_LOG_OPTIONS)
    assert "--log-style, --log-color, --verbose do not apply" in capsys.readouterr().err
    args = cli._parser().parse_args(["status", "--address", "127.0.0.1:6379", "-v"])
    assert (args.address, args.verbose) == ("127.0.0.1:6379", True)
    args = cli._parser().parse_args(["--logging-level", "info", "status", "--verbose"])
    assert args.verbose is True


def test_start_dashboard_options():
    """``--include-dashboard`` takes Ray's booleans; ``--dashboard-host/-port`` alone ask for
    it (Ray starts its dashboard by default); a non-loopback host is refused."""
    def options(*argv):
        return cli._dashboard_options(cli._parser().parse_args(["start", "--head", *argv]))

    assert options() is None
    assert options("--include-dashboard", "false", "--dashboard-port", "1") is None
    assert options("--include-dashboard", "true") == ("127.0.0.1", 8265)
    assert options("--dashboard-port", "0") == ("127.0.0.1", 0)
    assert options("--dashboard-host", "localhost") == ("127.0.0.1", 8265)
    with pytest.raises(ValueError, match="takes true or false"):
        options("--include-dashboard", "maybe")
    with pytest.raises(ValueError, match="--allow-remote"):
        options("--dashboard-host", "0.0.0.0")
    with pytest.raises(ValueError, match="0..65535"):
        options("--dashboard-port", "70000")


def test_dashboard_refuses_a_non_loopback_host_without_allow_remote(capsys):
    """One line naming the host and ``--allow-remote``; nothing is bound."""
    assert cli.main(["dashboard", "--host", "10.0.0.1", "--port", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--host 10.0.0.1" in err[0] and "--allow-remote" in err[0]
    assert cli.main(["dashboard", "--port", "70000"]) == 1
    assert "0..65535" in capsys.readouterr().err
