"""The owner names a task's output itself (``OutputStream.name``, ``WorkerSlot.name_output``):
the same lines, prefixes and log bytes as a marker line from the worker would give."""

from __future__ import annotations

import os
import select

import pytest

from miniray._private.owner.output import OutputStream
from miniray._private.owner.workers import WorkerSlot


class _Log:
    def __init__(self):
        self.writes = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.writes.append(b"<closed>")


@pytest.fixture
def pipes():
    made = []

    def pipe(target="stdout"):
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        stream = OutputStream(read_end, target, enabled=True, prefix_enabled=True)
        made.append((stream, write_end))
        return stream, write_end

    yield pipe
    for stream, write_end in made:
        stream.close()
        os.close(write_end)


def test_a_name_ends_a_partial_line_and_prefixes_what_follows(pipes, capsys):
    stream, write_end = pipes()
    os.write(write_end, b"\x00mr:7:first\nno newline")
    stream.drain()
    stream.name(7, "second")
    os.write(write_end, b"hello\n")
    stream.drain()
    assert capsys.readouterr().out == "(first pid=7) no newline\n(second pid=7) hello\n"


def test_a_name_gives_the_log_the_marker_a_worker_would_write(pipes):
    stream, write_end = pipes()
    log = stream.log = _Log()
    stream.name(7, "silent")
    stream.name(7, "loud")
    assert log.writes == []  # not while the task is being sent
    os.write(write_end, b"line\n")
    stream.drain()
    assert log.writes == [b"\x00mr:7:silent\n\x00mr:7:loud\nline\n"]
    stream.name(7, "last")
    stream.close()  # a name with nothing after it is written at close
    assert log.writes[1:] == [b"\x00mr:7:last\n", b"<closed>"]


def test_a_name_before_the_log_opens_is_kept_with_the_early_bytes(pipes):
    stream, write_end = pipes()
    stream.early = bytearray()
    os.write(write_end, b"early\n")
    stream.drain()
    stream.name(9, "task")
    log = _Log()
    stream.open_log(log)
    assert log.writes == [b"early\n\x00mr:9:task\n"]


def _slot(pipes):
    out, out_w = pipes("stdout")
    err, err_w = pipes("stderr")
    worker = WorkerSlot(None, None, 0)
    worker.out, worker.err, worker.pid, worker.ready = out, err, 5, True
    worker.output_poll = select.poll()
    worker.output_poll.register(out.fd, select.POLLIN)
    worker.output_poll.register(err.fd, select.POLLIN)
    return worker, out_w, err_w


def test_an_idle_ready_worker_is_named_after_what_it_printed_is_read(pipes, capsys):
    worker, out_w, err_w = _slot(pipes)
    worker.out.prefix = worker.err.prefix = "(old pid=5) "
    os.write(out_w, b"before\n")
    os.write(err_w, b"before err\n")
    assert worker.name_output("new")
    os.write(out_w, b"after\n")
    worker.drain_printed()
    captured = capsys.readouterr()
    assert captured.out == "(old pid=5) before\n(new pid=5) after\n"
    assert captured.err == "(old pid=5) before err\n"
    assert worker.err.prefix == "(new pid=5) "


@pytest.mark.parametrize("state", ["busy", "unready", "no pid", "remote"])
def test_a_worker_that_may_still_print_for_another_task_is_not_named(pipes, state):
    worker, _, _ = _slot(pipes)
    if state == "busy":
        worker.inflight.append(object())  # its earlier task's lines may still come
    elif state == "unready":
        worker.ready = False  # what it prints while starting may still come
    elif state == "no pid":
        worker.pid = None
    else:
        worker.output_poll = None  # no pipes of its own here
    assert not worker.name_output("new")
    assert worker.out.prefix == ""
