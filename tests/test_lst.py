"""LST math on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from alignment.lst import LSTAggregate, LSTMeter, tier_for, worst_sigma


def test_ttft_itl_jitter_hand_computed():
    m = LSTMeter()
    m.begin_response(10.0)
    for t in (10.050, 10.150, 10.250, 10.360):
        m.token(t)
    snap = m.snapshot()
    # TTFT 50 ms; ITLs 100, 100, 110 ms: mean 103.33, σ = sqrt((2*3.333² + 6.667²)/3) = 4.714 ms
    assert snap["ttft_ms_p99"] == pytest.approx(50.0, abs=1e-6)
    assert snap["itl_ms_max"] == pytest.approx(110.0, abs=1e-6)
    assert snap["jitter_ms"] == pytest.approx(math.sqrt((2 * (10 / 3) ** 2 + (20 / 3) ** 2) / 3), abs=1e-3)
    assert snap["tier"] == "silver"  # TTFT 50 ≤ 65 but jitter 4.7 > 3
    assert (snap["tokens"], snap["responses"], snap["intervals"]) == (4, 1, 3)


def test_a_stall_then_eight_even_intervals_is_not_gold():
    """The old rule (σ of the last 8 only) read this stream Gold; the worst window sees the stall."""
    m = LSTMeter()
    m.begin_response(0.0)
    t = 0.010
    m.token(t)
    for itl in (0.5, 0.3) + (0.1,) * 8:  # two wild intervals, then 8 perfect ones
        t += itl
        m.token(t)
    snap = m.snapshot()
    assert snap["jitter_ms_last8"] == pytest.approx(0.0, abs=1e-6)  # what the old rule judged
    # worst window: [500, 300, 100 × 6]: mean 175, σ = sqrt((325² + 125² + 6·75²)/8)
    assert snap["jitter_ms"] == pytest.approx(math.sqrt((325**2 + 125**2 + 6 * 75**2) / 8), abs=1e-3)
    assert snap["itl_ms_max"] == pytest.approx(500.0, abs=1e-6)
    assert snap["tier"] == "none"


def test_worst_sigma_over_windows_and_short_streams():
    assert worst_sigma([0.1]) is None
    assert worst_sigma([0.1, 0.12]) == pytest.approx(0.01)  # fewer than 8: σ of all
    even = [0.1] * 20
    assert worst_sigma(even) == pytest.approx(0.0)
    stalled = even[:10] + [0.2] + even[10:]
    assert worst_sigma(stalled) == pytest.approx(0.1 * math.sqrt(7) / 8)  # one stall in a window of 8


def test_turn_latency_and_lst_ttft_are_separate_figures():
    m = LSTMeter()
    m.begin_response(request_t=10.600, speech_end_t=10.0)  # the turn was decided 600 ms after speech ended
    first = m.token(10.650)
    second = m.token(10.750)
    assert first.ttft_s == pytest.approx(0.050) and first.turn_s == pytest.approx(0.650) and first.itl_s is None
    assert second.itl_s == pytest.approx(0.100) and second.ttft_s is None
    m.begin_response(request_t=20.0)  # end of speech unknown: no turn latency, still an LST TTFT
    m.token(20.040)
    snap = m.snapshot()
    assert m.ttfts_ms() == pytest.approx([50.0, 40.0]) and m.turns_ms() == pytest.approx([650.0])
    assert snap["turn_ms_p50"] == pytest.approx(650.0) and snap["ttft_ms_p99"] == pytest.approx(40 + 0.99 * 10)
    assert snap["lst_version"] == 3


def test_v3_ttft_ends_at_the_first_content_read_and_the_hold_is_turn_latency():
    """A prefetched answer: request written at 10.2, first delta read at 10.28, held for the turn's
    end, emitted at 10.45. LST TTFT 80 ms; the 170 ms hold is in the turn latency, and reported."""
    m = LSTMeter()
    m.begin_response(request_t=10.2, speech_end_t=10.0, first_content_t=10.28)
    first = m.token(10.45)
    assert first.ttft_s == pytest.approx(0.080) and first.hold_s == pytest.approx(0.170)
    assert first.turn_s == pytest.approx(0.450)
    snap = m.snapshot()
    assert snap["ttft_ms_p99"] == pytest.approx(80.0) and snap["hold_ms_p50"] == pytest.approx(170.0)
    assert snap["turn_ms_p50"] == pytest.approx(450.0)


def test_prefetch_waste_and_seq_integrity_are_counted_and_pooled():
    agg = LSTAggregate()
    m = agg.meter("a")
    for wasted in (False, False, True, False):
        m.prefetch(wasted=wasted)
    for kept in (True, True, False, True):
        m.answer_integrity(kept)
    snap = m.snapshot()
    assert (snap["prefetch_requests"], snap["prefetch_wasted"], snap["prefetch_waste"]) == (3, 1, round(1 / 3, 4))
    assert (snap["seq_answers"], snap["seq_integrity"]) == (4, 0.75)
    agg.meter("b").answer_integrity(True)
    agg.remove("a")
    pooled = agg.snapshot()
    assert (pooled["seq_answers"], pooled["seq_integrity"], pooled["prefetch_wasted"]) == (5, 0.8, 1)


def test_p99_linear_interpolation():
    m = LSTMeter()
    for k in range(1, 101):  # TTFTs of 1..100 ms, one per response
        m.begin_response(float(k))
        m.token(k + k / 1000.0)
    # rank 0.99 * 99 = 98.01 → 99 + 0.01 * (100 - 99)
    assert m.snapshot()["ttft_ms_p99"] == pytest.approx(99.01, abs=1e-6)


def test_no_interval_across_responses():
    m = LSTMeter()
    m.begin_response(0.0)
    m.token(0.1)
    m.token(0.2)
    m.response_end()
    m.token(5.0)  # a stray token after the response ended: no 4.8 s ITL
    m.begin_response(6.0)
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
    a.begin_response(0.0)
    for t in (0.040, 0.140, 0.240):  # TTFT 40, perfect 100 ms ITLs
        a.token(t)
    b.begin_response(0.0)
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
    assert snap["jitter_ms"] == pytest.approx(5.0, abs=1e-6)  # b closed, but its worst jitter still rules
    assert snap["jitter_ms_mean"] == pytest.approx(0.0, abs=1e-6)  # mean over live sessions


def test_aggregate_keeps_a_closed_sessions_worst_jitter():
    agg = LSTAggregate()
    m = agg.meter("gone")
    m.begin_response(0.0, speech_end_t=-0.5)
    t = 0.05
    m.token(t)
    for itl in (0.1, 0.1, 0.3, 0.1):
        t += itl
        m.token(t)
    worst = m.snapshot()["jitter_ms"]
    agg.remove("gone")
    snap = agg.snapshot()
    assert snap["jitter_ms"] == pytest.approx(worst) and snap["tier"] == "none"
    assert snap["turn_samples"] == 1 and snap["turn_ms_p50"] == pytest.approx(550.0)


def test_prometheus_exposition_has_pooled_and_per_session_lst():
    from app.live.server_metrics import ServerMetrics

    agg, metrics = LSTAggregate(), ServerMetrics()
    metrics.watch_lst(agg.snapshot)
    m = agg.meter("s1")
    m.begin_response(1.0, speech_end_t=0.7)
    for t in (1.040, 1.140, 1.240, 1.341):
        metrics.observe_lst(m.token(t))
    text = metrics.exposition().decode()
    assert "synchrony_lst_ttft_seconds_count 1.0" in text
    assert "synchrony_lst_turn_latency_seconds_count 1.0" in text
    assert "synchrony_lst_itl_seconds_count 3.0" in text
    assert "synchrony_lst_ttft_p99_seconds 0.04" in text
    assert 'synchrony_lst_session_jitter_seconds{session="s1"}' in text
    assert "synchrony_lst_tier 3.0" in text  # TTFT 40 ms, ITLs 100, 100, 101 ms (σ 0.47 ms): gold
    m.answer_integrity(True)
    m.answer_integrity(False)
    assert "synchrony_lst_seq_integrity 0.5" in metrics.exposition().decode()
