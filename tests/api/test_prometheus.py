"""Our Prometheus client writes what prometheus_client writes: dashboards and alert rules
were built against that package's output, and the CLI (``gpudra top``) parses it."""

from __future__ import annotations

import re
import threading
from types import ModuleType
from typing import Any

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudra.api import prometheus
from gpudra.api.prometheus import Counter, Gauge, Histogram, Registry, generate_latest


def record(module: ModuleType, registry: Any) -> None:
    """The same metrics and updates, through either client."""
    calls = module.Counter("x_calls", 'Calls, by "verb"\\ and\nmore', ["verb"],
                           registry=registry)
    calls.labels("get").inc()
    calls.labels(verb='li"st\n\\').inc(2)
    module.Counter("plain_total", "Plain", registry=registry).inc(3)
    module.Counter("unused", "Never counted", ["a"], registry=registry)
    module.Gauge("unused_gauge", "Never set", ["a"], registry=registry)
    gauge = module.Gauge("big", "A gauge", registry=registry)
    gauge.set(1e7)
    gauge.dec(0.5)
    labelled = module.Gauge("pairs", "Two labels", ["b", "a"], registry=registry)
    labelled.labels("1", "2").set(3.5)
    labelled.labels(a="x", b="y").inc()
    labelled.labels("r", "s").set(1)
    labelled.remove("r", "s")
    module.Gauge("negative", "Below zero", registry=registry).set(-1234567.25)
    seconds = module.Histogram("h_seconds", "Latency", buckets=(0.0005, 0.001, 1, 30),
                               registry=registry)
    for value in (0.5, 0.001, 100, 0):
        seconds.observe(value)
    ops = module.Histogram("ops", "By op", ["op"], buckets=(1e6, 12345678.0, float("inf")),
                           registry=registry)
    ops.labels("create").observe(2)
    module.Histogram("idle", "Never observed", ["op"], registry=registry)


def without_times(text: str) -> str:
    return re.sub(r"^(\w+_created(\{.*\})?) \S+$", r"\1 T", text, flags=re.MULTILINE)


def test_the_exposition_is_prometheus_clients_to_the_byte():
    theirs = prometheus_client.CollectorRegistry()
    record(prometheus_client, theirs)
    ours = Registry()
    record(prometheus, ours)
    expected = without_times(prometheus_client.generate_latest(theirs).decode())
    assert without_times(generate_latest(ours).decode()) == expected
    assert "x_calls_created" in expected  # the creation times are compared too (as T)


def test_the_content_type_is_prometheus_clients():
    assert prometheus.CONTENT_TYPE_LATEST == prometheus_client.CONTENT_TYPE_LATEST


def test_created_series_can_be_turned_off_as_in_prometheus_client(monkeypatch):
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "true")
    registry = Registry()
    Counter("c", "C", registry=registry).inc()
    Histogram("h", "H", registry=registry).observe(1)
    assert "_created" not in generate_latest(registry).decode()


def test_the_default_metrics_are_prometheus_clients():
    def series(text: str) -> list[str]:
        return [line.split(" ")[0].split("{")[0] for line in text.splitlines()]

    ours = generate_latest(prometheus.REGISTRY).decode()
    # prometheus_client's own registry holds only its defaults (nothing of ours uses it);
    # ours has them first, then the daemon's metrics that this test process imported.
    theirs = series(prometheus_client.generate_latest(prometheus_client.REGISTRY).decode())
    assert series(ours)[:len(theirs)] == theirs
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "python_info",
            "python_gc_collections_total"} <= set(theirs)
    # and every line parses
    assert list(text_string_to_metric_families(ours))


def test_sample_values_by_name_and_labels():
    registry = Registry()
    calls = Counter("api_calls", "Calls", ["verb"], registry=registry)
    calls.labels("get").inc(2)
    seconds = Histogram("t_seconds", "T", buckets=(1, 2), registry=registry)
    seconds.observe(1.5)
    assert registry.get_sample_value("api_calls_total", {"verb": "get"}) == 2
    assert registry.get_sample_value("api_calls_total", {"verb": "list"}) is None
    assert registry.get_sample_value("t_seconds_bucket", {"le": "1.0"}) == 0
    assert registry.get_sample_value("t_seconds_bucket", {"le": "2.0"}) == 1
    assert registry.get_sample_value("t_seconds_count") == 1
    assert registry.get_sample_value("t_seconds_sum") == 1.5


def test_misuse_is_refused_as_prometheus_client_refuses_it():
    registry = Registry()
    calls = Counter("calls", "Calls", ["verb"], registry=registry)
    with pytest.raises(ValueError, match="label values"):
        calls.labels("get", "extra")
    with pytest.raises(ValueError, match="label values"):
        calls.labels("get", verb="get")
    with pytest.raises(ValueError, match="use labels"):
        calls.inc()
    with pytest.raises(ValueError, match="only goes up"):
        calls.labels("get").inc(-1)
    with pytest.raises(KeyError):
        calls.remove("never-set")
    with pytest.raises(ValueError, match="registered twice"):
        Gauge("calls_total", "Clash", registry=registry)
    with pytest.raises(ValueError, match="le"):
        Histogram("h", "H", ["le"], registry=registry)


def test_updates_from_many_threads_are_all_counted():
    registry = Registry()
    calls = Counter("calls", "Calls", ["verb"], registry=registry)
    seconds = Histogram("s", "S", registry=registry)

    def work() -> None:
        for _ in range(2000):
            calls.labels("get").inc()
            seconds.observe(0.01)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert registry.get_sample_value("calls_total", {"verb": "get"}) == 16000
    assert registry.get_sample_value("s_count") == 16000
