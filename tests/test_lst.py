"""LST math on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from alignment.lst import LSTAggregate, LSTMeter, tier_for


def test_ttft_itl_jitter_hand_computed():
    m = LSTMeter()
    m.utterance_end(10.0)
    for t in (10.050, 10.150, 10.250, 10.360):
        m.token(t)
    snap = m.snapshot()
    # TTFT 50 ms; ITLs 100, 100, 110 ms: mean 103.33, σ = sqrt((2*3.333² + 6.667²)/3) = 4.714 ms
    assert snap["ttft_ms_p99"] == pytest.approx(50.0, abs=1e-6)
    assert snap["itl_ms_max"] == pytest.approx(110.0, abs=1e-6)
    assert snap["jitter_ms"] == pytest.approx(math.sqrt((2 * (10 / 3) ** 2 + (20 / 3) ** 2) / 3), abs=1e-3)
    assert snap["tier"] == "silver"  # TTFT 50 ≤ 65 but jitter 4.7 > 3
    assert (snap["tokens"], snap["responses"], snap["intervals"]) == (4, 1, 3)


def test_jitter_uses_only_last_eight_intervals():
    m = LSTMeter()
    m.utterance_end(0.0)
    t = 0.010
    m.token(t)
    for itl in (0.5, 0.3) + (0.1,) * 8:  # two wild intervals, then 8 perfect ones
        t += itl
        m.token(t)
    snap = m.snapshot()
    assert snap["jitter_ms"] == pytest.approx(0.0, abs=1e-6)
    assert snap["itl_ms_max"] == pytest.approx(500.0, abs=1e-6)
    assert snap["tier"] == "gold"


def test_p99_linear_interpolation():
    m = LSTMeter()
    for k in range(1, 101):  # TTFTs of 1..100 ms, one per response
        m.utterance_end(float(k))
        m.token(k + k / 1000.0)
    # rank 0.99 * 99 = 98.01 → 99 + 0.01 * (100 - 99)
    assert m.snapshot()["ttft_ms_p99"] == pytest.approx(99.01, abs=1e-6)


def test_no_interval_across_responses():
    m = LSTMeter()
    m.utterance_end(0.0)
    m.token(0.1)
    m.token(0.2)
    m.response_end()
    m.token(5.0)  # a stray token after the response ended: no 4.8 s ITL
    m.utterance_end(6.0)
    m.token(6.05)  # a new response: TTFT, not an ITL
    m.token(6.15)
    snap = m.snapshot()
    assert snap["itl_ms_max"] == pytest.approx(100.0, abs=1e-6)
    assert m.ttfts_ms() == pytest.approx([100.0, 50.0])
    assert snap["intervals"] == 2


def test_tier_boundaries():
    assert tier_for(65.0, 3.0) == "gold"
    assert tier_for(65.01, 3.0) == "silver"
    assert tier_for(60.0, 3.5) == "silver"
    assert tier_for(120.0, 8.0) == "silver"
    assert tier_for(200.0, 15.0) == "bronze"
    assert tier_for(200.5, 1.0) == "none"
    assert tier_for(10.0, 15.5) == "none"
    assert tier_for(None, 1.0) == "none"
    assert tier_for(10.0, None) == "none"


def test_empty_meter_reports_none():
    snap = LSTMeter().snapshot()
    assert snap["ttft_ms_p99"] is None and snap["jitter_ms"] is None and snap["tier"] == "none"


def test_aggregate_pools_sessions_and_keeps_closed_ones():
    agg = LSTAggregate()
    a, b = agg.meter("a"), agg.meter("b")
    assert agg.meter("a") is a
    a.utterance_end(0.0)
    for t in (0.040, 0.140, 0.240):  # TTFT 40, perfect 100 ms ITLs
        a.token(t)
    b.utterance_end(0.0)
    for t in (0.100, 0.200, 0.310):  # TTFT 100, ITLs 100, 110 → σ 5 ms
        b.token(t)
    snap = agg.snapshot()
    assert snap["sessions"] == 2
    assert snap["ttft_ms_p99"] == pytest.approx(40 + 0.99 * 60, abs=1e-6)
    assert snap["jitter_ms"] == pytest.approx(5.0, abs=1e-6)  # worst session
    assert snap["itl_ms_max"] == pytest.approx(110.0, abs=1e-6)
    assert snap["tier"] == "silver"
    agg.remove("b")
    snap = agg.snapshot()
    assert snap["sessions"] == 1 and snap["closed_sessions"] == 1
    assert snap["ttft_samples"] == 2 and snap["itl_ms_max"] == pytest.approx(110.0, abs=1e-6)
    assert snap["jitter_ms"] == pytest.approx(0.0, abs=1e-6)
