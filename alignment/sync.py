"""Level-3 sync validation: per token, audio, video and text times pairwise within 50 ms.

For a token with acoustic onset ``a``, first carrying output frame at ``f`` and an evidence-based A/V
offset ``d`` (:mod:`alignment.evidence`): audio = ``a``; text = ``f`` (the caption shows with that
frame); video = ``a + d`` when there is evidence, else ``f`` with ``evidence="assigned"``, which only
restates the pipeline's own pts. The aligner's ``a`` is also checked against evidence it did not make:
where the word follows silence, its acoustic onset (:mod:`alignment.onsets`) must lie in an accepted
window (wider before stops and weak consonants, whose sound rises late), counted apart.

``ok`` iff the three are pairwise within ``tolerance_ms`` and the onset check (where there is one)
passes. A token no frame carries has no text time (NaN; JSON null in :func:`sync_event`) and fails.
An offset estimate beyond ``flag_threshold_ms`` (halfway between what must pass and what must be
flagged, so a small estimation error flips neither) is flagged (:meth:`Level3Validator.offset_flagged`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from alignment.evidence import OffsetEstimate
from alignment.json_types import JsonObject
from alignment.onsets import onset_window_ms
from alignment.types import SyncCheck, WordToken

TOLERANCE_MS = 50.0
MUST_PASS_MS = 30.0
FLAG_THRESHOLD_MS = 40.0
_SLACK_MS = 1e-6
EVIDENCE_KINDS = ("markers", "lips", "assigned")


@dataclass(frozen=True)
class Level3Summary:
    """Pass rate and delta figures over the checks a validator has made."""

    checked: int
    passed: int
    missing_frame: int
    by_evidence: dict[str, int]
    max_delta_ms_p50: float | None
    max_delta_ms_p95: float | None
    max_delta_ms_max: float | None
    onset_checked: int = 0  # words that follow silence, checked against their acoustic onset
    onset_failed: int = 0  # ... placed outside the accepted range of it

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.checked if self.checked else None

    def as_dict(self) -> JsonObject:
        return {
            "checked": self.checked,
            "passed": self.passed,
            "pass_rate": None if self.pass_rate is None else round(self.pass_rate, 4),
            "missing_frame": self.missing_frame,
            "by_evidence": dict(self.by_evidence),
            "max_delta_ms_p50": self.max_delta_ms_p50,
            "max_delta_ms_p95": self.max_delta_ms_p95,
            "max_delta_ms_max": self.max_delta_ms_max,
            "onset_checked": self.onset_checked,
            "onset_failed": self.onset_failed,
        }


class Level3Validator:
    """Checks tokens against the Level-3 tolerance and keeps bounded running figures."""

    def __init__(
        self, tolerance_ms: float = TOLERANCE_MS, flag_threshold_ms: float = FLAG_THRESHOLD_MS,
        history: int = 4096,
    ) -> None:
        if tolerance_ms <= 0:
            raise ValueError("tolerance_ms must be positive")
        self.tolerance_ms = float(tolerance_ms)
        self.flag_threshold_ms = float(flag_threshold_ms)
        self._deltas: deque[float] = deque(maxlen=history)  # finite max deltas, for percentiles
        self._checked = 0
        self._passed = 0
        self._missing = 0
        self._evidence: Counter[str] = Counter()
        self._onset_checked = 0
        self._onset_failed = 0

    def check(
        self, token: WordToken, first_frame_pts: float | None, av_offset: float | None,
        evidence: str = "assigned", acoustic_onset: float | None = None,
    ) -> SyncCheck:
        """The Level-3 verdict for ``token`` (see the module docstring for the semantics);
        ``acoustic_onset`` is the word's onset in the audio where it follows silence, else None."""
        audio = float(token.start)
        text = math.nan if first_frame_pts is None else float(first_frame_pts)
        if av_offset is not None and math.isfinite(av_offset):
            if evidence not in ("markers", "lips"):
                raise ValueError(f"an A/V offset needs evidence 'markers' or 'lips', got {evidence!r}")
            video = audio + float(av_offset)
        else:
            video, evidence = text, "assigned"
        times = (audio, video, text)
        if any(math.isnan(t) for t in times):
            max_delta_ms = math.inf
        else:
            max_delta_ms = 1000.0 * (max(times) - min(times))
        ok = max_delta_ms <= self.tolerance_ms + _SLACK_MS
        audio_error_ms = None
        if acoustic_onset is not None and math.isfinite(acoustic_onset):
            audio_error_ms = 1000.0 * (audio - acoustic_onset)
            lo, hi = onset_window_ms(token.text)
            onset_ok = lo - _SLACK_MS <= audio_error_ms <= hi + _SLACK_MS
            self._onset_checked += 1
            self._onset_failed += int(not onset_ok)
            ok = ok and onset_ok
        self._record(max_delta_ms, ok, evidence)
        return SyncCheck(
            token=token.text, pts=audio, audio=audio, video=video, text=text,
            max_delta_ms=max_delta_ms, ok=ok, evidence=evidence,
            audio_onset=acoustic_onset if audio_error_ms is not None else None, audio_error_ms=audio_error_ms,
        )

    def check_estimate(
        self, token: WordToken, first_frame_pts: float | None, estimate: OffsetEstimate | None,
        acoustic_onset: float | None = None,
    ) -> SyncCheck:
        """:meth:`check` with the offset and evidence taken from an :class:`OffsetEstimate`."""
        if estimate is None or estimate.offset_s is None or estimate.source is None:
            return self.check(token, first_frame_pts, None, "assigned", acoustic_onset)
        return self.check(token, first_frame_pts, estimate.offset_s, estimate.source, acoustic_onset)

    def _record(self, max_delta_ms: float, ok: bool, evidence: str) -> None:
        self._checked += 1
        self._passed += int(ok)
        self._evidence[evidence] += 1
        if math.isfinite(max_delta_ms):
            self._deltas.append(max_delta_ms)
        else:
            self._missing += 1

    def offset_flagged(self, estimate: float | OffsetEstimate | None) -> bool:
        """True when an A/V offset estimate (s) is out of sync: ``|offset| > flag_threshold_ms``.

        No estimate (no evidence) is not flagged: there is nothing to flag it with.
        """
        offset = estimate.offset_s if isinstance(estimate, OffsetEstimate) else estimate
        if offset is None or not math.isfinite(offset):
            return False
        return abs(offset) * 1000.0 > self.flag_threshold_ms

    def summary(self) -> Level3Summary:
        """Pass rate and max-delta percentiles (over the last ``history`` finite checks)."""
        d = np.asarray(self._deltas, np.float64)

        def pct(q: float) -> float | None:
            return round(float(np.percentile(d, q)), 2) if d.size else None

        return Level3Summary(
            checked=self._checked,
            passed=self._passed,
            missing_frame=self._missing,
            by_evidence={k: self._evidence[k] for k in EVIDENCE_KINDS if self._evidence[k]},
            max_delta_ms_p50=pct(50),
            max_delta_ms_p95=pct(95),
            max_delta_ms_max=round(float(d.max()), 2) if d.size else None,
            onset_checked=self._onset_checked,
            onset_failed=self._onset_failed,
        )


def _finite(x: float, ndigits: int) -> float | None:
    return round(x, ndigits) if math.isfinite(x) else None


def sync_event(check: SyncCheck) -> JsonObject:
    """The wire ``sync`` message for a check (JSON-safe: NaN/inf become null)."""
    return {
        "type": "sync",
        "token": check.token,
        "pts": _finite(check.pts, 4),
        "audio": _finite(check.audio, 4),
        "video": _finite(check.video, 4),
        "text": _finite(check.text, 4),
        "max_delta_ms": _finite(check.max_delta_ms, 2),
        "ok": check.ok,
        "evidence": check.evidence,
        "audio_onset": None if check.audio_onset is None else _finite(check.audio_onset, 4),
        "audio_error_ms": None if check.audio_error_ms is None else _finite(check.audio_error_ms, 1),
    }
