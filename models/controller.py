"""AU-driven cognitive-load controller: an LSTM over a sliding AU window → load level → token-rate policy.

Why this shape:

* Faces differ far more between people than within a person under load, so every AU vector is
  taken relative to a per-person neutral baseline (the median of the first seconds of a session).
* The AU rate varies (15-30 Hz, dropped frames), so the window is resampled onto a fixed grid
  (``GRID_HZ``, sample-and-hold) before the LSTM sees it; the network never learns a frame rate.
* The raw class probabilities are smoothed and the level only changes with a margin, a short
  confirmation and a minimum dwell time (hysteresis), so the pace of the response does not flap.

The weights are loaded once per file and shared by every session; a ``LoadController`` holds only
one session's state. ``step`` may be called from one worker thread per session.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from alignment.types import AU_NAMES, AUSample, LoadEstimate, TokenRatePolicy

N_AU = len(AU_NAMES)
N_LEVELS = 4
GRID_HZ = 16.0  # the LSTM's time step: 62.5 ms, the output frame period
WINDOW_STEPS = 24  # 1.5 s of AU history
BASELINE_S = 5.0  # seconds of face samples that define the neutral baseline
DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "assets" / "controller.pt"
CHECKPOINT_FORMAT = 1

#: Policy per load level: monotone in load (higher load: slower, shorter, cooler).
POLICIES: tuple[TokenRatePolicy, ...] = (
    TokenRatePolicy(tokens_per_s=12.0, max_tokens=256, temperature=0.8),
    TokenRatePolicy(tokens_per_s=8.0, max_tokens=160, temperature=0.6),
    TokenRatePolicy(tokens_per_s=5.0, max_tokens=96, temperature=0.4),
    TokenRatePolicy(tokens_per_s=3.0, max_tokens=48, temperature=0.2),
)


def policy_for_level(level: int) -> TokenRatePolicy:
    """The token-rate policy for a load level 0-3."""
    if not 0 <= level < N_LEVELS:
        raise ValueError(f"load level must be 0..{N_LEVELS - 1}, got {level}")
    return POLICIES[level]


# --- shared feature pipeline (used identically by training and at run time) -----------------


def neutral_center(values: np.ndarray) -> np.ndarray:
    """Per-AU neutral baseline of one person: the median is robust to blinks and brief smiles."""
    if len(values) == 0:
        raise ValueError("a neutral baseline needs at least one face sample")
    return np.median(values, axis=0).astype(np.float32)


def baseline_count(ts: np.ndarray, baseline_s: float = BASELINE_S) -> int:
    """How many of the (face-only, increasing) sample times fall in the baseline period."""
    if len(ts) == 0:
        return 0
    return int(np.searchsorted(ts, ts[0] + baseline_s, side="right"))


def window_indices(
    ts: np.ndarray, t_end: np.ndarray, steps: int = WINDOW_STEPS, hz: float = GRID_HZ
) -> np.ndarray:
    """Sample-and-hold indices into ``ts`` for a grid window ending at each of ``t_end``.

    Returns shape ``(len(t_end), steps)``; an index of -1 means the grid point precedes the data.
    """
    offsets = (np.arange(steps, dtype=np.float64) - (steps - 1)) / hz
    grid = np.asarray(t_end, dtype=np.float64)[:, None] + offsets[None, :]
    return np.searchsorted(ts, grid + 1e-9, side="right") - 1


# --- the network ------------------------------------------------------------------------------


class LoadNet(nn.Module):
    """A one-layer LSTM over the normalised AU window, classifying from its last hidden state."""

    def __init__(self, hidden: int = 32, n_in: int = N_AU, n_levels: int = N_LEVELS) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_levels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


@dataclass(frozen=True)
class ControllerModel:
    """Loaded weights plus the feature settings they were trained with (shared, read-only)."""

    net: LoadNet
    feature_scale: np.ndarray  # per-AU divisor applied after baseline subtraction
    grid_hz: float
    window_steps: int
    baseline_s: float
    meta: dict

    def features(self, window: np.ndarray, center: np.ndarray) -> np.ndarray:
        """Baseline-relative, scaled features for raw AU windows ``(..., steps, 12)``."""
        return ((window - center) / self.feature_scale).astype(np.float32)

    def predict_proba(self, feats: np.ndarray) -> np.ndarray:
        """Class probabilities for a batch of feature windows ``(n, steps, 12)``.

        A single window runs on one intra-op thread: on 2 shared cores torch's thread pool costs
        ~10x the tiny LSTM itself. The setting is per calling thread and restored afterwards.
        """
        x = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))
        prev = torch.get_num_threads()
        narrow = len(x) <= 4 and prev != 1
        if narrow:
            torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                return torch.softmax(self.net(x), dim=-1).numpy()
        finally:
            if narrow:
                torch.set_num_threads(prev)


def save_checkpoint(
    path: Path,
    net: LoadNet,
    feature_scale: np.ndarray,
    meta: dict,
    grid_hz: float = GRID_HZ,
    window_steps: int = WINDOW_STEPS,
    baseline_s: float = BASELINE_S,
) -> None:
    """Write weights and feature settings in the format ``load_model`` reads."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "format": CHECKPOINT_FORMAT,
            "hidden": net.lstm.hidden_size,
            "grid_hz": float(grid_hz),
            "window_steps": int(window_steps),
            "baseline_s": float(baseline_s),
            "feature_scale": [float(v) for v in feature_scale],
            "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()},
            "meta": meta,
        },
        path,
    )


_CACHE: dict[str, ControllerModel] = {}
_CACHE_LOCK = threading.Lock()


def load_model(weights: str | Path | None = None) -> ControllerModel:
    """Load (once per file, then shared) the controller weights; defaults to assets/controller.pt."""
    path = Path(weights) if weights is not None else DEFAULT_WEIGHTS
    key = str(path.resolve())
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
        if not path.is_file():
            raise FileNotFoundError(f"controller weights not found: {path}")
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # corrupt or foreign file: say so instead of a pickle traceback
            raise ValueError(f"{path} is not a synchrony controller checkpoint: {exc}") from exc
        if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a synchrony controller checkpoint (format {CHECKPOINT_FORMAT})")
        net = LoadNet(hidden=int(ckpt["hidden"]))
        net.load_state_dict(ckpt["state_dict"])
        net.eval()
        model = ControllerModel(
            net=net,
            feature_scale=np.asarray(ckpt["feature_scale"], dtype=np.float32),
            grid_hz=float(ckpt["grid_hz"]),
            window_steps=int(ckpt["window_steps"]),
            baseline_s=float(ckpt["baseline_s"]),
            meta=dict(ckpt.get("meta", {})),
        )
        _CACHE[key] = model
        return model


# --- the per-session controller ---------------------------------------------------------------


@dataclass(frozen=True)
class Hysteresis:
    """How reluctant the level is to change (all times on the session clock, seconds).

    A jump of two or more levels is rarely noise, so it is confirmed quickly; a step to the next
    level is where noise flaps, so it must persist longer.
    """

    smoothing_s: float = 0.10  # EMA time constant on the class probabilities
    margin: float = 0.35  # new level's smoothed prob must beat the current one's by this much
    confirm_s: float = 0.10  # ... continuously for this long (jumps of >= 2 levels)
    confirm_adjacent_s: float = 1.0  # ... or this long (a step to the next level)
    min_dwell_s: float = 2.0  # and the current level must have lasted this long (≤ 1 change per 2 s)


class LevelTracker:
    """Smoothed probabilities → a level that changes only with margin, confirmation and dwell."""

    def __init__(self, hysteresis: Hysteresis) -> None:
        self.h = hysteresis
        self.smooth: np.ndarray | None = None
        self.level: int | None = None
        self._pts: float | None = None
        self._since = -math.inf
        self._candidate: int | None = None
        self._candidate_since = 0.0

    def update(self, pts: float, probs: np.ndarray) -> int:
        h = self.h
        if self.smooth is None or self._pts is None:
            self.smooth = np.asarray(probs, dtype=np.float64)
        else:
            dt = max(pts - self._pts, 0.0)
            alpha = 1.0 - math.exp(-dt / h.smoothing_s) if h.smoothing_s > 0 else 1.0
            self.smooth = self.smooth + alpha * (probs - self.smooth)
        self._pts = pts
        smooth = self.smooth
        best = int(np.argmax(smooth))
        if self.level is None:
            self.level, self._since = best, pts
            return best
        if best == self.level or smooth[best] - smooth[self.level] < h.margin:
            self._candidate = None
        elif self._candidate != best:
            self._candidate, self._candidate_since = best, pts
        if (
            self._candidate is not None
            and pts - self._candidate_since
            >= (h.confirm_s if abs(self._candidate - self.level) >= 2 else h.confirm_adjacent_s) - 1e-9
            and pts - self._since >= h.min_dwell_s
        ):
            self.level, self._since, self._candidate = self._candidate, pts, None
        return self.level


class LoadController:
    """One session's load estimator: baseline → window → LSTM → smoothed level with hysteresis.

    ``step`` returns None while the baseline is being learnt or the first window fills. Samples
    without a face (or with non-finite AUs, or out of order) hold the last estimate; a face gap
    longer than ``max_gap_s`` restarts the window (the level is held while it refills).
    """

    def __init__(
        self,
        weights: str | Path | ControllerModel | None = None,
        hysteresis: Hysteresis | None = None,
        max_gap_s: float = 1.0,
    ) -> None:
        self.model = weights if isinstance(weights, ControllerModel) else load_model(weights)
        self.hysteresis = hysteresis or Hysteresis()
        self.max_gap_s = max_gap_s
        self._lock = threading.Lock()
        self._span_s = (self.model.window_steps - 1) / self.model.grid_hz
        self._clear()

    def _clear(self) -> None:
        self._baseline: list[np.ndarray] = []
        self._baseline_t0: float | None = None
        self._center: np.ndarray | None = None
        self._times: deque[float] = deque()
        self._values: deque[np.ndarray] = deque()
        self._last_pts: float | None = None
        self._tracker = LevelTracker(self.hysteresis)
        self._last: LoadEstimate | None = None

    def reset(self) -> None:
        """Forget the person: baseline, window and level start again."""
        with self._lock:
            self._clear()

    @property
    def baseline(self) -> np.ndarray | None:
        """The learnt neutral AU vector (None until learnt)."""
        return None if self._center is None else self._center.copy()

    def step(self, sample: AUSample) -> LoadEstimate | None:
        """Feed one AU sample; return the current estimate (None while still warming up)."""
        with self._lock:
            window = self._push(sample)
            if window is None:
                return self._hold(sample.pts)
            probs = self.model.predict_proba(self.model.features(window, self._center)[None])[0]
            return self._estimate(sample.pts, probs.astype(np.float64))

    def run(self, samples: list[AUSample]) -> list[LoadEstimate | None]:
        """``step`` over a recorded sequence, with the network batched (same results, much faster)."""
        with self._lock:
            plan: list[tuple[float, np.ndarray | None]] = []
            for s in samples:
                w = self._push(s)
                plan.append((s.pts, None if w is None else self.model.features(w, self._center)))
            feats = [w for _, w in plan if w is not None]
            probs = (
                np.concatenate(
                    [self.model.predict_proba(np.stack(feats[i : i + 2048])) for i in range(0, len(feats), 2048)]
                )
                if feats
                else np.zeros((0, N_LEVELS))
            )
            out: list[LoadEstimate | None] = []
            k = 0
            for pts, w in plan:
                if w is None:
                    out.append(self._hold(pts))
                else:
                    out.append(self._estimate(pts, probs[k].astype(np.float64)))
                    k += 1
            return out

    def _push(self, sample: AUSample) -> np.ndarray | None:
        """Take a sample into baseline / window; return the raw grid window when one is due."""
        vec = np.asarray(sample.au, dtype=np.float32)
        usable = (
            sample.face
            and vec.shape == (N_AU,)
            and bool(np.all(np.isfinite(vec)))
            and (self._last_pts is None or sample.pts > self._last_pts)
        )
        if not usable:
            return None
        vec = np.clip(vec, 0.0, 1.0)
        if self._last_pts is not None and sample.pts - self._last_pts > self.max_gap_s:
            self._times.clear()
            self._values.clear()
        self._last_pts = sample.pts
        self._times.append(sample.pts)
        self._values.append(vec)
        while len(self._times) > 1 and self._times[1] <= sample.pts - self._span_s:
            self._times.popleft()
            self._values.popleft()
        if self._center is None:
            if self._baseline_t0 is None:
                self._baseline_t0 = sample.pts
            self._baseline.append(vec)
            if sample.pts - self._baseline_t0 < self.model.baseline_s:
                return None
            self._center = neutral_center(np.stack(self._baseline))
            self._baseline = []
        if self._times[0] > sample.pts - self._span_s + 1e-9:
            return None  # window still filling
        m = self.model
        ts = np.fromiter(self._times, dtype=np.float64, count=len(self._times))
        idx = window_indices(ts, np.array([sample.pts]), m.window_steps, m.grid_hz)[0]
        return np.stack(self._values)[np.maximum(idx, 0)]

    def _hold(self, pts: float) -> LoadEstimate | None:
        if self._last is None:
            return None
        return LoadEstimate(pts=pts, level=self._last.level, probs=self._last.probs, policy=self._last.policy)

    def _estimate(self, pts: float, probs: np.ndarray) -> LoadEstimate:
        level = self._tracker.update(pts, probs)
        smooth = self._tracker.smooth
        est = LoadEstimate(
            pts=pts,
            level=level,
            probs=tuple(float(p) for p in smooth),  # type: ignore[arg-type]
            policy=policy_for_level(level),
        )
        self._last = est
        return est
