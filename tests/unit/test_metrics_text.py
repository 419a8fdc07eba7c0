"""The sidecar's metrics text (``schedlock.core.metrics``) against ``prometheus_client``'s.

The same definitions and updates made through both must give the same page, byte for byte,
except the ``_created`` series the client adds (and schedlock leaves out): dashboards, alert
rules (``le="15.0"``) and the tests that parse ``/metrics`` were written against that text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import prometheus_client as reference
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from schedlock.core import metrics
from schedlock.sidecar.metrics import SidecarMetrics
from schedlock.store.retention import FINISHED_STATES
from testbed.sidecars import sample_value

BUCKETS = (0.005, 0.25, 1, 15, 120)
HELP = 'Help with a backslash \\ and a\nnewline and "quotes".'
KEY = ("publish", "shop", "bill")
ODD = 'quote " backslash \\ newline \n ünïcode'


def without_created(text: bytes) -> bytes:
    """The reference page without its ``_created`` families (HELP, TYPE and samples)."""
    lines = re.findall(r"[^\n]*\n", text.decode())  # not splitlines: a label may hold \x1e
    kept = [line for line in lines if not re.match(r"(# (HELP|TYPE) )?\w+_created[ {]", line)]
    return "".join(kept).encode()


def both(build: Callable[[Any, Any], None]) -> tuple[bytes, bytes]:
    """Run ``build(module, registry)`` against ours and the reference (the two modules take
    the same calls, so ``Any``); both pages."""
    ours = metrics.Registry()
    build(metrics, ours)
    theirs = reference.CollectorRegistry(auto_describe=True)
    build(reference, theirs)
    return ours.exposition(), without_created(reference.generate_latest(theirs))


def definitions(m: Any, registry: Any) -> tuple[Any, Any, Any, Any]:
    gauge = m.Gauge("t_gauge", HELP, ("scheduler", "namespace", "target"), registry=registry)
    counter = m.Counter("t_fires_total", "Fires.", ("outcome",), registry=registry)
    histogram = m.Histogram(
        "t_gap_seconds", "Gaps.", ("target",), buckets=BUCKETS, registry=registry
    )
    up = m.Gauge("t_up", "Up.", registry=registry)
    return gauge, counter, histogram, up


def test_the_page_is_the_reference_clients_without_created_series() -> None:
    def build(m: Any, registry: Any) -> None:
        gauge, counter, histogram, up = definitions(m, registry)
        gauge.labels(*KEY).set(3)
        gauge.labels("recurring", "shop", ODD).set(-0.5)
        gauge.labels(*KEY).inc(2.25)
        counter.labels("published").inc()
        counter.labels("failed")  # exported at 0
        counter.labels("published").inc(4)
        for value in (0.005, 0.0051, 1, 15, 15.0001, 120, 121, 1e9, 0):  # bounds are inclusive
            histogram.labels("bill").observe(value)
        histogram.labels("idle")  # every bucket at 0
        up.set(1)
        up.dec()
        up.inc(3)
        if m is metrics:
            metrics.Info("t_build", "Build.", {"version": "1.2.3"}, registry=registry)
        else:
            reference.Info("t_build", "Build.", registry=registry).info({"version": "1.2.3"})

    ours, theirs = both(build)
    assert ours == theirs
    assert b'le="15.0"' in ours and b'le="+Inf"' in ours  # the text alert rules match


def test_special_values_are_written_as_the_format_says() -> None:
    def build(m: Any, registry: Any) -> None:
        gauge = m.Gauge("t_values", "Values.", ("v",), registry=registry)
        for name, value in {
            "inf": math.inf,
            "minus_inf": -math.inf,
            "nan": math.nan,
            "big": 1.5e300,
            "small": 2.5e-12,
            "integer": 7,
        }.items():
            gauge.labels(name).set(value)

    ours, theirs = both(build)
    assert ours == theirs
    assert b" +Inf\n" in ours and b" -Inf\n" in ours and b" NaN\n" in ours


@settings(max_examples=60, deadline=None)
@given(
    observations=st.lists(st.floats(min_value=0, max_value=1e6), max_size=30),
    label=st.text(max_size=12),
)
def test_any_observations_and_label_values_give_the_reference_text(
    observations: list[float], label: str
) -> None:
    def build(m: Any, registry: Any) -> None:
        histogram = m.Histogram("t_h_seconds", "H.", ("l",), buckets=BUCKETS, registry=registry)
        for value in observations:
            histogram.labels(label).observe(value)

    ours, theirs = both(build)
    assert ours == theirs


def test_the_sidecars_page_matches_the_reference_for_every_metric() -> None:
    """The sidecar's own page (every family ``SidecarMetrics`` defines) is read back by the
    reference's parser, with the types and samples it was written with."""
    sidecar = SidecarMetrics()
    sidecar.init_key(*KEY)
    sidecar.init_history(dict.fromkeys(FINISHED_STATES, 86400.0))
    sidecar.lateness.labels(*KEY).observe(0.003)
    sidecar.fires.labels(*KEY, "published").inc()
    page = sidecar.registry.exposition().decode()
    families = re.findall(r"^# TYPE (\w+) (\w+)$", page, re.MULTILINE)
    assert len(families) == 20 and ("schedlock_build_info", "gauge") in families
    # Prometheus' own parser (the reference's) reads it, every sample a float.
    parsed = {f.name: f for f in text_string_to_metric_families(page)}
    assert parsed["schedlock_fires"].type == "counter"
    assert parsed["schedlock_fire_lateness_seconds"].type == "histogram"
    assert (
        sample_value(
            sidecar.registry,
            "schedlock_fire_lateness_seconds_bucket",
            {"scheduler": "publish", "namespace": "shop", "target": "bill", "le": "0.005"},
        )
        == 1.0
    )


@pytest.mark.parametrize(
    ("define", "error"),
    [
        (lambda r: metrics.Gauge("1bad", "h", registry=r), "invalid metric name"),
        (lambda r: metrics.Gauge("ok", "h", ("__reserved",), registry=r), "invalid label name"),
        (lambda r: metrics.Gauge("ok", "h", ("bad-label",), registry=r), "invalid label name"),
        (lambda r: metrics.Histogram("h", "h", ("le",), buckets=(1,), registry=r), "'le'"),
        (lambda r: metrics.Histogram("h", "h", buckets=(2, 1), registry=r), "ascending"),
        (lambda r: metrics.Histogram("h", "h", buckets=(1, 1), registry=r), "distinct"),
        (lambda r: metrics.Counter("fires", "h", registry=r), "ends in _total"),
        (lambda r: metrics.Info("b", "h", {"__x": "1"}, registry=r), "invalid label name"),
    ],
)
def test_a_wrong_definition_fails_at_once(
    define: Callable[[metrics.Registry], object], error: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        define(metrics.Registry())


def test_misuse_of_a_series_fails_and_changes_nothing() -> None:
    registry = metrics.Registry()
    gauge, counter, _, _ = definitions(metrics, registry)
    assert isinstance(gauge, metrics.Gauge) and isinstance(counter, metrics.Counter)
    counter.labels("published").inc(2)
    before = registry.exposition()
    with pytest.raises(ValueError, match="takes 3 label values"):
        gauge.labels("publish")
    with pytest.raises(ValueError, match="has labels"):
        gauge.set(1)
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("published").inc(-1)
    with pytest.raises(ValueError, match="defined twice"):
        metrics.Gauge("t_up", "Again.", registry=registry)
    assert registry.exposition() == before
    assert sample_value(registry, "t_fires_total", {"outcome": "published"}) == 2.0
    assert sample_value(registry, "t_up") == 0.0
    assert sample_value(registry, "t_up", {"x": "y"}) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0.0"),
        (15, "15.0"),
        (0.0025, "0.0025"),
        (1e-5, "1e-05"),
        (999999.5, "999999.5"),
        (1e6, "1e+06"),
        (1796415053.5302567, "1.7964150535302567e+09"),
        (-2.5e7, "-2.5e+07"),
        (1e10, "1e+10"),  # the reference writes 1e+010 here; Go and Prometheus write 1e+10
        (1.5e300, "1.5e+300"),
        (math.inf, "+Inf"),
    ],
)
def test_numbers_are_written_as_go_writes_them(value: float, text: str) -> None:
    assert metrics.number(value) == text
    assert float(text) == value
