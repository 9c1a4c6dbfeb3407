"""``miniray.util.metrics``: Counter, Gauge, Histogram recorded in the driver, in tasks and in
actors, merged in the driver and rendered by ``prometheus_text()`` (a miniray addition).

The constructors' and record methods' errors and warnings were compared with Ray 2.60 (same
types and wording): empty name, invalid name (warned, discarded), tag_keys not a tuple,
unknown default tag, missing tag key, non-str tag value, ``inc`` of a value <= 0, a non-number,
a Histogram without boundaries or with a boundary <= 0, ``Gauge.set(None)`` doing nothing.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings

import pytest

from miniray.util import metrics

GET_TIMEOUT = 30


def _samples(text: str) -> dict:
    """``{"name{labels}": value}`` of the exposition's sample lines."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_values_from_tasks_actors_and_the_driver_are_merged(ray):
    requests = metrics.Counter("app_requests", description="Requests served.",
                               tag_keys=("route",))
    latency = metrics.Histogram("app_latency", description="Latency.",
                                boundaries=[0.1, 1.0], tag_keys=("route",))
    depth = metrics.Gauge("app_depth", description="Queue depth.")

    @ray.remote
    def serve(counter, histogram, index):
        counter.inc(2, tags={"route": "/a"})
        # Default tags do not travel with a pickled metric (as in Ray 2.60): set them here.
        histogram.set_default_tags({"route": "/a"})
        histogram.observe(0.05 if index == 0 else 0.5)
        return os.getpid()

    @ray.remote
    class Server:
        def __init__(self, counter, gauge):
            self.counter, self.gauge = counter, gauge

        def serve(self):
            self.counter.inc(tags={"route": "/b"})
            self.gauge.set(7)
            return os.getpid()

    pids = set(ray.get([serve.remote(requests, latency, i) for i in range(4)],
                       timeout=GET_TIMEOUT))
    server = Server.remote(requests, depth)
    pids |= set(ray.get([server.serve.remote() for _ in range(3)], timeout=GET_TIMEOUT))
    requests.inc(tags={"route": "/a"})
    assert os.getpid() not in pids

    text = metrics.prometheus_text()
    samples = _samples(text)
    assert samples['app_requests_total{route="/a"}'] == 9.0  # 4 tasks x 2 + the driver's 1
    assert samples['app_requests_total{route="/b"}'] == 3.0
    assert samples["app_depth"] == 7.0
    assert samples['app_latency_bucket{route="/a",le="0.1"}'] == 1
    assert samples['app_latency_bucket{route="/a",le="1.0"}'] == 4
    assert samples['app_latency_bucket{route="/a",le="+Inf"}'] == 4
    assert samples['app_latency_count{route="/a"}'] == 4
    assert samples['app_latency_sum{route="/a"}'] == pytest.approx(1.55)
    assert "# TYPE app_requests_total counter" in text
    assert "# HELP app_depth Queue depth." in text
    assert "# TYPE app_latency histogram" in text


def test_a_threaded_actors_concurrent_calls_all_count(ray):
    calls = metrics.Counter("app_calls")

    @ray.remote(max_concurrency=4)
    class Busy:
        def call(self, counter):
            counter.inc()
            return 1

    busy = Busy.remote()
    assert sum(ray.get([busy.call.remote(calls) for _ in range(40)], timeout=GET_TIMEOUT)) == 40
    assert _samples(metrics.prometheus_text())["app_calls_total"] == 40.0


def test_the_last_gauge_value_set_wins_across_processes(ray):
    gauge = metrics.Gauge("app_level")
    gauge.set(1)

    @ray.remote
    def set_level(g, value):
        g.set(value)

    ray.get(set_level.remote(gauge, 5), timeout=GET_TIMEOUT)
    assert _samples(metrics.prometheus_text())["app_level"] == 5.0
    gauge.set(3)
    assert _samples(metrics.prometheus_text())["app_level"] == 3.0


def test_a_task_that_records_nothing_writes_nothing(ray):
    @ray.remote
    def plain():
        return 1

    assert ray.get(plain.remote(), timeout=GET_TIMEOUT) == 1
    from miniray._private import runtime

    assert not os.path.exists(os.path.join(runtime.current().session_dir, "metrics"))
    assert _samples(metrics.prometheus_text()) == {}


def test_metrics_pickle_by_definition():
    histogram = metrics.Histogram("h_pickled", "d", boundaries=[1.0], tag_keys=("k",))
    copy = pickle.loads(pickle.dumps(histogram))
    assert copy.info == {"name": "h_pickled", "description": "d", "tag_keys": ("k",),
                         "default_tags": {}, "boundaries": [1.0]}
    assert metrics.Counter("n", "d").info == {"name": "n", "description": "d",
                                              "tag_keys": (), "default_tags": {}}


@pytest.mark.parametrize("make, error, message", [
    (lambda: metrics.Counter(""), ValueError, "Empty name is not allowed"),
    (lambda: metrics.Counter("c", tag_keys=["a"]), TypeError,
     "tag_keys should be a tuple type, got: <class 'list'>"),
    (lambda: metrics.Counter("c", tag_keys=("a",)).inc(-1, tags={"a": "x"}), ValueError,
     "value must be >0, got -1"),
    (lambda: metrics.Counter("c", tag_keys=("a",)).inc(0, tags={"a": "x"}), ValueError,
     "value must be >0, got 0"),
    (lambda: metrics.Counter("c", tag_keys=("a",)).inc(1), ValueError,
     "Missing value for tag key(s): a."),
    (lambda: metrics.Counter("c", tag_keys=("a",)).inc("1", tags={"a": "x"}), TypeError,
     "value must be int or float, got <class 'str'>."),
    (lambda: metrics.Counter("c", tag_keys=("a",)).set_default_tags({"b": "x"}), ValueError,
     "Unrecognized tag key b."),
    (lambda: metrics.Gauge("g", tag_keys=("k",)).set(1, tags={"k": 1}), TypeError,
     "Tag values must be str, got <class 'int'>."),
    (lambda: metrics.Histogram("h"), ValueError,
     "boundaries argument should be provided when using the Histogram class"),
    (lambda: metrics.Histogram("h", boundaries=[0, 1]), ValueError,
     "Invalid `boundaries` argument at index 0, [0, 1]. Use positive values"),
])
def test_bad_input_raises_as_ray_does(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_an_invalid_name_warns_and_records_nothing():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counter = metrics.Counter("1bad")
    assert any("Invalid metric name: 1bad" in str(w.message) for w in caught)
    counter.inc()
    metrics.Gauge("g_none").set(None)
    assert "1bad" not in metrics.prometheus_text()
