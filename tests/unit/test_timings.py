"""The lease timings: one number in, every interval derived from it, every rule kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monitoring import alerts
from schedlock.core.timings import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_TIMINGS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
    LeaseTimingError,
    LeaseTimings,
)
from schedlock.sidecar.metrics import GAP_BUCKETS

CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "schedlock" / "values.yaml"


def test_the_defaults_are_those_the_documentation_states() -> None:
    assert DEFAULT_TIMINGS.lease_seconds == DEFAULT_LEASE_SECONDS == 10
    assert DEFAULT_TIMINGS.heartbeat_seconds == 3
    assert DEFAULT_TIMINGS.step_down_after == 8
    assert DEFAULT_TIMINGS.keepalive_idle_seconds == 3
    assert DEFAULT_TIMINGS.handover_budget_seconds == 13
    assert DEFAULT_TIMINGS.keepalive_settings() == {
        "keepalive_idle": "3",
        "keepalive_interval": "1",
        "keepalive_count": "3",
    }


@pytest.mark.parametrize("lease", [MIN_LEASE_SECONDS, 2.5, 3, 4, 5, 6, 7.5, 10, 30, 120, 300])
def test_every_lease_alone_gives_timings_that_keep_the_rules(lease: float) -> None:
    t = LeaseTimings(lease)
    assert t.heartbeat_seconds <= lease / 3  # the rule an explicit heartbeat is held to
    assert t.heartbeat_seconds < t.step_down_after < lease
    if lease >= 3:
        assert 2 * t.heartbeat_seconds < t.step_down_after  # a late beat still has a second try
    assert lease / 3 < t.step_down_after  # an explicit heartbeat too is due before step-down
    assert lease - t.step_down_after >= 1  # the margin before the server ends the session
    idle_to_drop = t.keepalive_idle_seconds + t.keepalive_interval_seconds * t.keepalive_count
    assert t.keepalive_idle_seconds >= 1 and idle_to_drop <= lease + 3
    assert LeaseTimings(lease, t.heartbeat_seconds).heartbeat_seconds == t.heartbeat_seconds


def test_lease_five_alone_derives_its_heartbeat() -> None:
    t = LeaseTimings(5)
    assert (t.heartbeat_seconds, t.step_down_after) == (1.5, 4)


def test_an_explicit_heartbeat_is_kept_and_checked_against_the_lease() -> None:
    assert LeaseTimings(6, 2).heartbeat_seconds == 2
    with pytest.raises(LeaseTimingError, match=r"at most a third of the lease \(6s / 3\), got 3"):
        LeaseTimings(6, 3)
    with pytest.raises(LeaseTimingError) as caught:
        LeaseTimings(10, 0)
    assert caught.value.setting == "heartbeat"


@pytest.mark.parametrize("lease", [MIN_LEASE_SECONDS - 0.5, MAX_LEASE_SECONDS + 1])
def test_a_lease_out_of_range_is_refused_in_one_line(lease: float) -> None:
    with pytest.raises(LeaseTimingError, match=r"^must be a number from 2 to 300, got") as caught:
        LeaseTimings(lease)
    assert caught.value.setting == "lease" and "\n" not in str(caught.value)


def test_the_chart_states_the_same_default_lease() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert values["injection"]["sidecar"]["leaseSeconds"] == DEFAULT_LEASE_SECONDS
    assert "heartbeatSeconds" not in values["injection"]["sidecar"]  # derived, never stated


def test_the_handover_alert_threshold_derives_from_the_default_timings() -> None:
    threshold = alerts.HANDOVER_GAP_SECONDS
    assert threshold in GAP_BUCKETS  # the rule subtracts that bucket: exact, no interpolation
    assert threshold >= DEFAULT_TIMINGS.handover_budget_seconds
    below = [b for b in GAP_BUCKETS if b < threshold]
    assert max(below) < DEFAULT_TIMINGS.handover_budget_seconds  # the smallest such bound
    rule = next(a for a in alerts.ALERTS if a.name == "SchedlockHandoverGapHigh")
    assert f'le="{float(threshold)!r}"' in rule.value
