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


def test_a_tee_keeps_what_came_before_the_pid_and_writes_the_rest(tmp_path):
    session = str(tmp_path / "session_t")
    os.makedirs(session)
    tee = worker_logs.LogTee()
    tee.write(b"early\n")
    tee.write(b"x" * (2 * worker_logs.LogTee.EARLY_MAX))  # beyond the bound: not kept
    tee.open(session, 42, err=False, cap=1 << 20)
    tee.write(b"\nlater\n")
    tee.open(session, 43, err=False, cap=1 << 20)  # a second open changes nothing
    tee.close()
    tee.write(b"after close\n")  # dropped, never an error
    with open(worker_logs.log_path(session, 42, err=False), "rb") as f:
        data = f.read()
    assert data.startswith(b"early\n") and data.endswith(b"\nlater\n")
    assert len(data) == worker_logs.LogTee.EARLY_MAX + len(b"\nlater\n")
    assert not os.path.exists(worker_logs.log_path(session, 43, err=False))


def test_a_tee_closed_before_its_pid_is_known_still_keeps_what_came(tmp_path):
    session = str(tmp_path / "session_u")
    os.makedirs(session)
    tee = worker_logs.LogTee()
    tee.write(b"last words\n")
    tee.close()  # the worker exited before the node handled its SPAWNED
    tee.open(session, 7, err=True, cap=1 << 20)
    with open(worker_logs.log_path(session, 7, err=True), "rb") as f:
        assert f.read() == b"last words\n"
    silent = worker_logs.LogTee()  # printed nothing: no file
    silent.open(session, 8, err=False, cap=1 << 20)
    silent.close()
    assert not os.path.exists(worker_logs.log_path(session, 8, err=False))
    off = worker_logs.LogTee()  # cap 0 (MINIRAY_WORKER_LOG_BYTES=0) or no session
    off.write(b"x\n")
    off.open(session, 9, err=False, cap=0)
    off.open("", 10, err=False, cap=100)
    off.close()
    assert sorted(os.listdir(os.path.join(session, "logs"))) == ["worker-7.err"]


def test_a_tee_whose_session_is_gone_turns_its_file_off(tmp_path):
    tee = worker_logs.LogTee()
    tee.write(b"x\n")
    tee.open(str(tmp_path / "gone"), 5, err=False, cap=100)  # no error
    tee.write(b"y\n")
    tee.close()
    assert not os.path.exists(tmp_path / "gone")


def test_a_nodes_answer_to_another_hosts_logs_query_is_read_only_and_bounded(tmp_path,
                                                                             monkeypatch):
    session = str(tmp_path / "session_q")
    os.makedirs(session)
    worker_logs.ensure_logs_dir(session)
    for pid, err, text in ((3, False, b"\x00mr:3:f\nhello\n"), (3, True, b"oops\n")):
        log = worker_logs.CappedLog(worker_logs.log_path(session, pid, err), 1 << 20)
        log.write(text)
        log.close()
    with open(os.path.join(session, "node.log"), "w") as f:
        f.write("not a worker's\n")
    answer = worker_logs.answer_query
    assert answer(session, {"what": "list"}) == (
        "logs", {"worker_out": ["worker-3.out"], "worker_err": ["worker-3.err"]})
    assert answer(session, {"what": "list", "glob": "*.err"}) == (
        "logs", {"worker_err": ["worker-3.err"]})
    assert answer(session, {"what": "get", "pid": 3}) == ("logs", ":task_name:f\nhello\n")
    assert answer(session, {"what": "get", "pid": 3, "suffix": "err"}) == ("logs", "oops\n")
    assert answer(session, {"what": "get", "filename": "worker-3.out", "tail": 1}) == (
        "logs", "hello\n")
    for name in ("node.log", "../session_q/node.log", "/etc/passwd"):  # worker files only
        assert answer(session, {"what": "get", "filename": name})[0] == "no_log"
    assert answer(session, {"what": "get", "pid": 4})[0] == "no_log"
    for bad in (None, [], {"what": "rm"}, {"what": "get"}, {"what": "get", "pid": "3"},
                {"what": "get", "pid": 3, "suffix": "log"}, {"what": "list", "glob": 5},
                {"what": "get", "filename": "x" * 300},
                # one file per get (a glob would read every worker's files on the loop)
                {"what": "get", "filename": "worker-*"}, {"what": "get", "filename": "w?"},
                {"what": "get", "actor_id": "../node"}):
        assert answer(session, bad)[0] == "malformed", bad
    monkeypatch.setattr(worker_logs, "MAX_ANSWER_CHARS", 20)
    log = worker_logs.CappedLog(worker_logs.log_path(session, 5, False), 1 << 20)
    log.write(b"".join(b"line %02d\n" % i for i in range(10)))
    log.close()
    kind, text = answer(session, {"what": "get", "pid": 5, "tail": -1})
    assert kind == "logs" and text == "line 08\nline 09\n"  # the end, whole lines


def test_following_a_log_loses_and_repeats_no_line(tmp_path, monkeypatch):
    session = str(tmp_path / "session_f")
    os.makedirs(session)
    worker_logs.ensure_logs_dir(session)
    path = worker_logs.log_path(session, 7, False)
    with open(path, "wb") as f:
        f.write(b"\x00mr:7:g\none\ntwo\npart")  # a line not ended yet
    text, state = worker_logs.follow_step([path], 1, None)
    assert text == "two\n" and state == ["worker-7.out", os.stat(path).st_ino,
                                         len(b"\x00mr:7:g\none\ntwo\n")]  # the tail
    assert worker_logs.follow_step([path], 1, state) == ("", state)  # nothing whole yet
    with open(path, "ab") as f:
        f.write(b"ial\nthree\n")
    text, state = worker_logs.follow_step([path], 1, state)
    assert text == "partial\nthree\n" and state[2] == os.path.getsize(path)
    # Over another host: the same steps, the state carried in the query.
    answer = worker_logs.answer_query
    kind, (text, there) = answer(session, {"what": "follow", "pid": 7, "tail": 2})
    assert (kind, text, there) == ("logs", "partial\nthree\n", state)
    with open(path, "ab") as f:
        f.write(b"four\n")
    assert answer(session, {"what": "follow", "pid": 7, "state": there}) == (
        "logs", ["four\n", there[:2] + [there[2] + 5]])
    for bad in ({"what": "follow", "pid": 7, "state": ["worker-7.out", 1, -1]},
                {"what": "follow", "pid": 7, "state": [1, 2, 3]},
                {"what": "follow", "pid": 7, "state": ["../node.log", 1, 0]},
                {"what": "follow", "pid": 7, "state": ["node.log", 1, 0]},
                {"what": "follow", "pid": 7, "state": 3},
                {"what": "follow", "filename": "worker-*"}):
        assert answer(session, bad)[0] == "malformed", bad


def _follow_all(paths, state, steps=8):
    out = []
    for _ in range(steps):
        text, state = worker_logs.follow_step(paths(), 1, state)
        out.append(text)
    return "".join(out), state


def test_a_follow_goes_on_across_a_rotation_and_an_actors_next_worker(tmp_path,
                                                                      monkeypatch):
    session = str(tmp_path / "session_r")
    os.makedirs(session)
    worker_logs.ensure_logs_dir(session)
    path = worker_logs.log_path(session, 8, False)
    log = worker_logs.CappedLog(path, 100)
    for i in range(5):
        log.write(b"line %02d\n" % i)  # 8 bytes each

    def paths():
        return worker_logs.find_log([session], pid=8)[0]

    text, state = worker_logs.follow_step(paths(), 2, None)
    assert text == "line 03\nline 04\n"
    for i in range(5, 20):  # past the cap: the file rotates while nobody reads
        log.write(b"line %02d\n" % i)
    text, state = _follow_all(paths, state)
    assert text == "".join(f"line {i:02d}\n" for i in range(5, 20)), text
    log.close()
    # The actor's next worker writes a file of its own: the rest of the old one first.
    with open(path, "ab") as f:
        f.write(b"last words")  # its worker died before the newline
    new = worker_logs.log_path(session, 9, False)
    with open(new, "wb") as f:
        f.write(b"new 00\nnew 01\n")
    text, state = _follow_all(lambda: [path, new], state)
    assert text == "last words\nnew 00\nnew 01\n", text
    assert state[0] == "worker-9.out"
    # A step reads at most MAX_ANSWER_CHARS bytes; a longer line comes in pieces, cut
    # between characters.
    monkeypatch.setattr(worker_logs, "MAX_ANSWER_CHARS", 8)
    with open(new, "ab") as f:
        f.write("abcdefg\u00e9hijk\nxy\n".encode())
    text, state = _follow_all(lambda: [new], state)
    assert text.replace("\n", "") == "abcdefg\u00e9hijkxy", text
    assert state[2] == os.path.getsize(new)
