"""``tqdm_ray``'s pure parts (``core/progress_bars.py``) and the driver's display
(``owner/progress_display.py``) with fake streams: no processes.

Ray 2.60 (``ray.experimental.tqdm_ray``) sends a bar's whole state (count, total, desc,
position, pid, uuid, closed) at most once per ``flush_interval_s`` and when it closes; the
driver draws one line per bar. These tests hold miniray's wire form, order, throttling and
text; ``tests/integration/test_tqdm_ray.py`` runs real tasks.
"""

from __future__ import annotations

import builtins
import io

from miniray._private.core import progress_bars
from miniray._private.core.progress_bars import BarBoard, decode, encode, format_bar
from miniray._private.owner import progress_display
from miniray._private.owner.progress_display import BarDisplay


def _state(uuid="u1", x=0, total=10, desc="work", pos=0, pid=42, closed=False, start=None):
    state = {"x": x, "pos": pos, "desc": desc, "total": total, "unit": "it", "pid": pid,
             "uuid": uuid, "closed": closed}
    if start is not None:
        state["start"] = start
    return state


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_an_update_is_one_marked_line_and_decodes_back():
    line = encode(_state(x=3))
    assert line.startswith(progress_bars.BAR_MARKER) and line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line.rstrip(b"\n")) == _state(x=3)
    assert decode(line.decode().rstrip("\n")) == _state(x=3)


def test_malformed_updates_are_ignored():
    assert decode(progress_bars.BAR_MARKER + b"{not json") is None
    assert decode(progress_bars.BAR_MARKER + b"[1, 2]") is None
    broken = _state()
    del broken["uuid"]
    assert decode(encode(broken)) is None
    assert decode(encode({**_state(), "total": "ten"})) is None
    assert decode(encode({**_state(), "x": None})) is None


def test_the_board_orders_bars_by_source_then_position_and_drops_closed_ones():
    board = BarBoard()
    board.apply("7", "(b pid=7) ", _state("b1", pos=1, pid=7), 0.0)
    board.apply("5", "(a pid=5) ", _state("a0", pos=0, pid=5), 0.0)
    board.apply("7", "(b pid=7) ", _state("b0", pos=0, pid=7), 0.0)
    assert [bar.state["uuid"] for bar in board.live()] == ["b0", "b1", "a0"]
    assert board.live()[0].label == "(b pid=7) work"
    bar = board.apply("7", "(b pid=7) ", _state("b0", x=10, pid=7, closed=True), 1.0)
    assert bar.state["x"] == 10
    assert [bar.state["uuid"] for bar in board.live()] == ["b1", "a0"]


def test_a_log_gets_the_first_line_one_per_interval_while_moving_and_the_last():
    board = BarBoard()
    bar = board.apply("1", "", _state(x=1), 0.0)
    assert board.log_due(bar, 0.0)
    board.logged(bar, 0.0)
    bar = board.apply("1", "", _state(x=2), 1.0)
    assert not board.log_due(bar, 1.0)  # within the interval
    bar = board.apply("1", "", _state(x=2), 100.0)
    board.logged(bar, 100.0)
    bar = board.apply("1", "", _state(x=2), 200.0)
    assert not board.log_due(bar, 200.0)  # did not move
    bar = board.apply("1", "", _state(x=3), 200.0 + progress_bars.LOG_INTERVAL_S)
    assert board.log_due(bar, 200.0 + progress_bars.LOG_INTERVAL_S)
    bar = board.apply("1", "", _state(x=3, closed=True), 200.5)
    assert board.log_due(bar, 200.5)


def test_format_looks_like_tqdm_and_fits_the_width():
    board = BarBoard()
    bar = board.apply("1", "(f pid=1) ", _state(x=4, total=10, start=100.0), 0.0)
    line = format_bar(bar, 102.0, width=100)
    assert line.startswith("(f pid=1) work:  40%|")
    assert line.endswith("| 4/10 [00:02<00:03, 2.00it/s]")
    assert len(line) <= 100
    assert len(format_bar(bar, 102.0, width=30)) <= 30
    bar = board.apply("1", "", _state("u2", x=5, total=None, desc="", start=100.0), 0.0)
    assert format_bar(bar, 110.0) == "5it [00:10, 0.50it/s]"


def test_a_log_display_writes_plain_lines():
    out = io.StringIO()
    display = BarDisplay(out)
    display.apply("1", "(f pid=1) ", _state(x=1))
    display.apply("1", "(f pid=1) ", _state(x=2))  # throttled
    display.apply("1", "(f pid=1) ", _state(x=10, closed=True))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert lines[0].startswith("(f pid=1) work:  10%|")
    assert lines[1].startswith("(f pid=1) work: 100%|") and " 10/10 [" in lines[1]
    assert display.drawn == 0 and not display.board.bars


def test_a_terminal_display_redraws_in_place_and_writes_output_above(monkeypatch):
    monkeypatch.setattr(builtins, "print", builtins.print)  # restored after the test
    out = Terminal()
    display = BarDisplay(out)
    display.apply("1", "", _state("a", x=1, desc="first"))
    display.apply("1", "", _state("b", x=1, desc="second", pos=1))
    assert display.drawn == 2
    out.seek(0)
    out.truncate()
    display.apply("1", "", _state("a", x=5, desc="first"))
    text = out.getvalue()
    assert text.startswith("\x1b[2F\x1b[J")  # up over the block, cleared, drawn again
    assert text.count("\x1b[2K") == 2 and "first:  50%|" in text
    out.seek(0)
    out.truncate()
    forwarded = Terminal()
    display.write_above(forwarded, "(g pid=2) hello\n")
    assert forwarded.getvalue() == "(g pid=2) hello\n"
    assert out.getvalue().startswith("\x1b[2F\x1b[J") and display.drawn == 2
    out.seek(0)
    out.truncate()
    display.apply("1", "", _state("a", x=10, desc="first", closed=True))
    text = out.getvalue()
    # The closed bar's last line stays above; the block is the other bar alone.
    assert text.index("first: 100%|") < text.index("second:")
    assert display.drawn == 1
    display.hide()
    assert display.drawn == 0 and display.hidden
    display.unhide()
    assert display.drawn == 1


def test_print_is_patched_once_bars_are_drawn_in_place(monkeypatch):
    monkeypatch.setattr(builtins, "print", progress_display._print)
    monkeypatch.setattr(progress_display, "_display", None)
    monkeypatch.setenv("RAY_TQDM_PATCH_PRINT", "0")
    BarDisplay(Terminal()).apply("1", "", _state())
    assert builtins.print is progress_display._print
    monkeypatch.delenv("RAY_TQDM_PATCH_PRINT")
    BarDisplay(io.StringIO()).apply("1", "", _state())  # a log: nothing to protect
    assert builtins.print is progress_display._print
    BarDisplay(Terminal()).apply("1", "", _state())
    assert builtins.print is progress_display.safe_print


def test_safe_print_hides_and_redraws_the_bars(monkeypatch, capsys):
    out = Terminal()
    display = BarDisplay(out)
    monkeypatch.setattr(progress_display, "_display", display)
    monkeypatch.setattr(builtins, "print", builtins.print)
    display.apply("1", "", _state())
    out.seek(0)
    out.truncate()
    progress_display.safe_print("between")
    assert capsys.readouterr().out == "between\n"
    assert out.getvalue().startswith("\x1b[1F\x1b[J\x1b[2Kwork:")
    other = io.StringIO()
    progress_display.safe_print("elsewhere", file=other)
    assert other.getvalue() == "elsewhere\n"


def test_the_output_reader_takes_bar_lines_out_even_mid_line(monkeypatch, capsys):
    """A task's last print without a newline runs into the bar's line: the text is still
    printed with the task's prefix, the bar goes to the display, nothing raw leaks."""
    import os

    from miniray._private.owner.output import OutputStream

    shown = io.StringIO()
    monkeypatch.setattr(progress_display, "_display", BarDisplay(shown))
    read_end, write_end = os.pipe()
    stream = OutputStream(read_end, "stdout", enabled=True, prefix_enabled=True)
    try:
        os.write(write_end, b"\x00mr:77:crunch\nno newline" + encode(_state(x=3, pid=77))
                 + b"after\n")
        os.close(write_end)
        stream.drain()
    finally:
        stream.close()
    assert capsys.readouterr().out == "(crunch pid=77) no newline\n(crunch pid=77) after\n"
    assert shown.getvalue().startswith("(crunch pid=77) work:  30%|")


def test_routed_output_carries_bars_with_their_prefix_to_deliver(monkeypatch, capsys):
    import os

    from miniray._private.owner import output

    shown = io.StringIO()
    monkeypatch.setattr(progress_display, "_display", BarDisplay(shown))
    routed = []
    read_end, write_end = os.pipe()
    stream = output.OutputStream(read_end, "stdout", enabled=True, prefix_enabled=True)
    stream.route = lambda target, text: routed.append((target, text)) or True
    try:
        os.write(write_end, b"\x00mr:9:Actor.go\nhi\n" + encode(_state(x=1, pid=9)))
        os.close(write_end)
        stream.drain()
    finally:
        stream.close()
    assert shown.getvalue() == "" and capsys.readouterr().out == ""
    (target, text), = routed
    output.deliver(target, text)  # what the creating driver does with SVC_OUTPUT
    assert capsys.readouterr().out == "(Actor.go pid=9) hi\n"
    assert shown.getvalue().startswith("(Actor.go pid=9) work:  10%|")
