"""Prometheus metrics on an explicit registry, written in the text exposition format 0.0.4.

The sidecar's whole need: counters, gauges, histograms and one info metric, with labels,
scraped at ``/metrics``.  ``prometheus_client`` does this too, but importing it imports its
HTTP servers, WSGI adapter and push-gateway client (``http.server``, ``wsgiref``,
``urllib.request``, ``email``), code a sidecar never runs: a sidecar's idle RSS is 40.8 MB with
it and 38.8 MB without (docs/performance.md, "footprint").  What is kept of its behaviour:

* the same text for the same metrics: families in the order they were defined, series in the
  order they were first used, label pairs sorted by name, values and bucket bounds as
  :func:`number` writes them (``0.0``, ``15.0``, ``+Inf``; alerting rules match
  ``le="15.0"``);
* no ``_created`` series (the time a series was first used: nothing here reads it);
* metric and label names are checked when a metric is defined, so a wrong one fails at start
  and never yields a page Prometheus refuses; label values may be any text (escaped);
* a counter only goes up, a histogram's buckets are sorted and end in ``+Inf``.

Not thread-safe: the sidecar updates and renders its metrics on its one event loop.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def number(value: float) -> str:
    """A sample value or bucket bound as Go writes a float (``strconv.FormatFloat(v, 'g', -1,
    64)``, the text of Prometheus' own clients): Python's shortest form, but with an exponent
    from 10**6 on (``1.7e+09``), and ``+Inf``, ``-Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
    whole, _, fraction = digits.partition(".")
    if "e" in digits or len(whole) <= 6:
        return text
    mantissa = f"{whole[0]}.{whole[1:]}{fraction}".rstrip("0").rstrip(".")
    return f"{sign}{mantissa}e+{len(whole) - 1:02d}"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _check_label(label: str, metric: str, reserved: tuple[str, ...] = ()) -> None:
    if not _LABEL_NAME.fullmatch(label) or label.startswith("__") or label in reserved:
        raise ValueError(f"invalid label name {label!r} of metric {metric}")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{_escape_value(value)}"' for name, value in sorted(pairs))
    return f"{{{inner}}}" if inner else ""


class Registry:
    """The metrics of one process, in the order they were defined."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric[Any]] = {}

    def add(self, metric: Metric[Any]) -> None:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is defined twice")
        self._metrics[metric.name] = metric

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """Every sample: its name, its labels and its value."""
        for metric in self._metrics.values():
            yield from metric.samples()

    def exposition(self) -> bytes:
        """The text a scrape gets."""
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.append(f"# HELP {metric.name} {_escape_help(metric.documentation)}")
            lines.append(f"# TYPE {metric.name} {metric.kind}")
            lines.extend(
                f"{sample}{_labels(labels.items())} {number(value)}"
                for sample, labels, value in metric.samples()
            )
        return ("\n".join(lines) + "\n").encode() if lines else b""


class Series:
    """One series' value(s), as samples: a name suffix, labels beyond the series', a value."""

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        raise NotImplementedError


S = TypeVar("S", bound=Series)


class Metric(Generic[S]):
    """A named family of series, one per combination of its label values."""

    kind = ""
    suffix = ""  # what the name must end in

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry,
    ) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        if not name.endswith(self.suffix):
            raise ValueError(f"a {self.kind}'s name ends in {self.suffix}: {name}")
        for label in labelnames:
            _check_label(label, name, reserved=("le",) if self.kind == "histogram" else ())
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], S] = {}
        if not self.labelnames:
            self._series[()] = self._new()
        registry.add(self)

    def _new(self) -> S:
        raise NotImplementedError

    def labels(self, *values: str) -> S:
        """The series of these label values (made, at its zero value, on first use)."""
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"{self.name} takes {len(self.labelnames)} label values "
                f"({', '.join(self.labelnames)}), got {len(values)}"
            )
        key = tuple(str(value) for value in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._new()
        return series

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        for values, series in self._series.items():
            labels = dict(zip(self.labelnames, values, strict=True))
            for suffix, extra, value in series.samples():
                yield f"{self.name}{suffix}", {**labels, **extra}, value

    def _only(self) -> S:
        """The one series of a metric without labels."""
        if self.labelnames:
            raise ValueError(f"{self.name} has labels: use .labels(...) first")
        return self._series[()]


class _ValueSeries(Series):
    """A series of one value (a gauge's or a counter's)."""

    def __init__(self) -> None:
        self.value = 0.0

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        yield "", {}, self.value


class GaugeSeries(_ValueSeries):
    def set(self, value: float) -> None:
        self.value = float(value)

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount


class CounterSeries(_ValueSeries):
    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up: inc({amount:g})")
        self.value += amount


class HistogramSeries(Series):
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket; the samples are cumulative
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        self.counts[bisect_left(self.bounds, value)] += 1

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        total = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            total += count
            yield "_bucket", {"le": number(bound)}, float(total)
        yield "_count", {}, float(total)
        yield "_sum", {}, self.sum


class InfoSeries(Series):
    def __init__(self, facts: Mapping[str, str]) -> None:
        self.facts = dict(facts)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        yield "", dict(self.facts), 1.0


class Gauge(Metric[GaugeSeries]):
    kind = "gauge"

    def _new(self) -> GaugeSeries:
        return GaugeSeries()

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._only().dec(amount)


class Counter(Metric[CounterSeries]):
    """A counter; its name ends in ``_total``, and the family is exposed under that name."""

    kind = "counter"

    suffix = "_total"

    def _new(self) -> CounterSeries:
        return CounterSeries()

    def inc(self, amount: float = 1) -> None:
        self._only().inc(amount)


class Histogram(Metric[HistogramSeries]):
    """Buckets by upper bound (``le``); ``+Inf`` is added when the bounds do not end in it."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: Registry,
    ) -> None:
        bounds = tuple(float(bound) for bound in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds = (*bounds, math.inf)
        if len(bounds) < 2 or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be distinct and ascending, at least one")
        self.bounds = bounds
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new(self) -> HistogramSeries:
        return HistogramSeries(self.bounds)


class Info(Metric[InfoSeries]):
    """Constant facts, as the labels of one gauge ``<name>_info`` of value 1."""

    kind = "gauge"

    def __init__(
        self, name: str, documentation: str, facts: Mapping[str, str], *, registry: Registry
    ) -> None:
        for label in facts:
            _check_label(label, name)
        self.facts = dict(facts)
        super().__init__(f"{name}_info", documentation, registry=registry)

    def _new(self) -> InfoSeries:
        return InfoSeries(self.facts)
