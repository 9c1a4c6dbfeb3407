"""``core/metric_values.py``: recording, merging across processes and the Prometheus text
format, with no process started."""

from __future__ import annotations

from miniray._private.core import metric_values as mv


def _recorder_with(kind, values, boundaries=None, tags=None):
    recorder = mv.MetricRecorder()
    for value in values:
        recorder.record(kind, "m", "help", tags or {}, value, boundaries)
    return recorder


def test_counters_and_histograms_add_up_gauges_keep_the_latest():
    a = _recorder_with(mv.COUNTER, [1, 2], tags={"k": "v"})
    b = _recorder_with(mv.COUNTER, [4], tags={"k": "v"})
    merged = mv.merge([a.snapshot(), b.snapshot()])
    assert merged["m"]["series"] == {(("k", "v"),): 7.0}

    h1 = _recorder_with(mv.HISTOGRAM, [0.5, 1.0, 3.0], boundaries=[2.0, 1.0])
    h2 = _recorder_with(mv.HISTOGRAM, [5.0], boundaries=[1.0, 2.0])
    merged = mv.merge([h1.snapshot(), h2.snapshot()])
    # Boundaries are kept sorted; a value equal to a boundary counts in that bucket (le).
    assert merged["m"]["series"][()] == [2, 0, 2, 9.5, 4]

    older, newer = mv.MetricRecorder(), mv.MetricRecorder()
    older.record(mv.GAUGE, "m", "", {}, 1.0)
    newer.record(mv.GAUGE, "m", "", {}, 2.0)
    assert mv.merge([newer.snapshot(), older.snapshot()])["m"]["series"][()][0] == 2.0


def test_a_kind_conflict_keeps_the_first_kind():
    counter = _recorder_with(mv.COUNTER, [1])
    gauge = _recorder_with(mv.GAUGE, [9])
    merged = mv.merge([counter.snapshot(), gauge.snapshot()])
    assert merged["m"]["kind"] == mv.COUNTER and merged["m"]["series"][()] == 1.0


def test_render_text_format():
    recorder = mv.MetricRecorder()
    recorder.record(mv.COUNTER, "c", 'say "hi"\n', {"b": 'x"y', "a": "1"}, 2)
    recorder.record(mv.HISTOGRAM, "h", "", {}, 0.5, [1.0])
    recorder.declare(mv.GAUGE, "g", "unused")
    assert mv.render(recorder.snapshot()) == (
        '# HELP c_total say "hi"\\n\n'
        "# TYPE c_total counter\n"
        'c_total{a="1",b="x\\"y"} 2.0\n'
        "# HELP g unused\n"
        "# TYPE g gauge\n"
        "# HELP h \n"
        "# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1\n'
        'h_bucket{le="+Inf"} 1\n'
        "h_sum 0.5\n"
        "h_count 1\n")
    assert mv.render({}) == ""


def test_dirty_until_a_snapshot_of_every_record_is_written():
    recorder = mv.MetricRecorder()
    assert not recorder.dirty
    recorder.record(mv.COUNTER, "c", "", {}, 1)
    assert recorder.dirty
    generation, _ = recorder.snapshot_with_generation()
    assert recorder.dirty
    recorder.record(mv.COUNTER, "c", "", {}, 1)  # recorded while that snapshot was written
    recorder.mark_flushed(generation)
    assert recorder.dirty
    generation, _ = recorder.snapshot_with_generation()
    recorder.mark_flushed(generation)
    assert not recorder.dirty
