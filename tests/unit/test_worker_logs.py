"""Workers' log files (``host/worker_logs.py``): the cap and its one rotated generation,
markers read back as Ray's ``:task_name:`` lines, and names that cannot leave ``logs/``."""

from __future__ import annotations

import os

from miniray._private.host import worker_logs


def test_a_log_keeps_at_most_two_generations_of_the_cap(tmp_path):
    path = str(tmp_path / "worker-1.out")
    log = worker_logs.CappedLog(path, 100)
    for i in range(50):
        log.write(f"line {i:03d}\n".encode())  # 9 bytes each: 450 in all
    log.close()
    assert os.path.getsize(path) < 100 and os.path.getsize(path + ".1") <= 108
    text = worker_logs.read_text([path + ".1", path], -1)
    assert text.endswith("line 049\n")
    numbers = [int(line.split()[1]) for line in text.splitlines()]
    assert numbers == list(range(numbers[0], 50)) and numbers[0] > 0  # the oldest are gone
    log.write(b"after close\n")  # a closed log ignores writes: never the output path's error


def test_markers_become_task_name_lines_and_bars_are_dropped(tmp_path):
    path = tmp_path / "worker-2.out"
    path.write_bytes(b"\x00mr:2:f\nhello\npartial\x00mr:2:g\n\x00mb:{\"x\": 1}\nbye\n")
    assert worker_logs.read_text([str(path)], -1) == \
        ":task_name:f\nhello\npartial\n:task_name:g\nbye\n"
    assert worker_logs.read_text([str(path)], 2) == ":task_name:g\nbye\n"
    assert worker_logs.read_text([str(path)], 0) == ""


def test_names_and_ids_are_found_in_the_sessions_logs_only(tmp_path):
    session = str(tmp_path / "session_x")
    os.makedirs(session)
    worker_logs.ensure_logs_dir(session)
    log = worker_logs.CappedLog(worker_logs.log_path(session, 7, err=True), 1000)
    log.write(b"oops\n")
    log.close()
    worker_logs.note_actor(session, "abcd", 7)
    worker_logs.note_actor(session, "abcd", 9)  # restarted in another process
    assert worker_logs.find_worker_logs([session], 7, err=True) == \
        [worker_logs.log_path(session, 7, err=True)]
    assert worker_logs.find_worker_logs([session], 7, err=False) == []
    assert worker_logs.find_actor_pids([session], "abcd") == (session, [7, 9])
    assert worker_logs.find_named([session], "worker-7.err") == \
        [worker_logs.log_path(session, 7, err=True)]
    assert worker_logs.find_named([session], "../logs/worker-7.err") == []
    assert worker_logs.find_named([session], "owner.pid") == []
    assert worker_logs.find_named([session], "worker-*") == \
        [worker_logs.log_path(session, 7, err=True)]
    assert worker_logs.find_named([session], "worker-*.out") == []
    assert "worker-7.err" in worker_logs.listing([session])
    gone = str(tmp_path / "session_gone")
    worker_logs.note_actor(gone, "abcd", 1)  # a removed session is not re-created
    assert not os.path.exists(gone)


def test_a_log_that_stayed_empty_is_removed_on_close(tmp_path):
    empty = worker_logs.CappedLog(str(tmp_path / "worker-3.out"), 100)
    empty.close()
    assert not os.path.exists(tmp_path / "worker-3.out")
    kept = worker_logs.CappedLog(str(tmp_path / "worker-3.err"), 100)
    kept.write(b"x\n")
    kept.close()
    assert os.path.exists(tmp_path / "worker-3.err")


def test_a_line_split_by_rotation_is_read_whole(tmp_path):
    path = str(tmp_path / "worker-7.out")
    with open(path + ".1", "w") as f:
        f.write("task line 2998\ntask line ")
    with open(path, "w") as f:
        f.write("2999\n")
    other = str(tmp_path / "worker-8.out")
    with open(other, "w") as f:
        f.write("no newline at its end")
    text = worker_logs.read_text([path + ".1", path, other], -1)
    assert text == "task line 2998\ntask line 2999\nno newline at its end\n"
    assert worker_logs.read_text([path + ".1", path], 1) == "task line 2999\n"


def test_a_rotated_generation_alone_is_read():
    assert worker_logs.read_text(["/nonexistent/worker-1.out.1"], -1) == ""
