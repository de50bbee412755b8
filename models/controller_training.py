"""Training data, training and evaluation for the load controller; the AU session CSV format.

No licensed AU dataset may be shipped, so the shipped weights are trained on ``synthetic_session``:
12-AU dynamics per cognitive-load level with per-person variation and noise, following qualitative
findings in the literature (assets/CONTROLLER_MODEL_CARD.md has them with sources): brow lowering
(AU4) and lid tightening (AU7) rise with effort and blinks are inhibited; chin raise, lip stretch and
lip-corner depression (AU17, AU20, AU15) rise under strain; smiles (AU6 + AU12) become rarer; lips
part with speech, unrelated to load. Magnitudes, time constants and rates are our assumptions.

Real data use one CSV format (written by ``AUSessionRecorder``, read by ``read_sessions``):
``session,pts,AU1,AU2,AU4,AU6,AU7,AU9,AU12,AU15,AU17,AU20,AU25,AU26,face,label`` — one row per AU
sample, ``pts`` in seconds on the session clock, AUs in [0, 1], ``face`` 0/1, ``label`` 0-3 or
empty. ``train_controller_command`` retrains from such a file.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from alignment.types import AU_NAMES, AUSample
from models.controller import (
    BASELINE_S,
    DEFAULT_WEIGHTS,
    GRID_HZ,
    N_AU,
    N_LEVELS,
    WINDOW_STEPS,
    ControllerModel,
    LoadController,
    LoadNet,
    baseline_count,
    load_model,
    neutral_center,
    save_checkpoint,
    window_indices,
)

CSV_COLUMNS: tuple[str, ...] = ("session", "pts", *AU_NAMES, "face", "label")
_IDX = {name: i for i, name in enumerate(AU_NAMES)}

# --- the synthetic generator ------------------------------------------------------------------

#: Tonic change per AU at full load (level 3), relative to neutral; see the module docstring.
LOAD_SIGNATURE: dict[str, float] = {
    "AU1": 0.05, "AU2": 0.03, "AU4": 0.26, "AU6": -0.03, "AU7": 0.20, "AU9": 0.03,
    "AU12": -0.06, "AU15": 0.07, "AU17": 0.16, "AU20": 0.12, "AU25": 0.0, "AU26": 0.0,
}
#: How much of the full-load signature each level shows (levels are not evenly spaced in faces).
LEVEL_FRACTION = (0.0, 0.32, 0.64, 1.0)
SMILE_RATE = (0.10, 0.06, 0.03, 0.015)  # smiles per second at each level
BLINK_RATE = (0.35, 0.30, 0.22, 0.15)  # blinks per second (visual-task blink inhibition)


@dataclass(frozen=True)
class SyntheticPerson:
    """One simulated face: resting AUs, expressivity, idiosyncrasies, noise and camera rate."""

    neutral: np.ndarray  # (12,) resting intensities
    gain: float  # overall expressivity
    signature_scale: np.ndarray  # (12,) per-AU idiosyncratic multiplier of the load signature
    noise: float  # slow (AR) noise amplitude
    jitter: float  # per-frame measurement noise
    rate_hz: float  # AU samples per second
    talkativeness: float  # fraction of time speaking (AU25/AU26 activity)
    onset_s: float  # how fast the face follows a load change (0: at once)


def random_person(rng: np.random.Generator) -> SyntheticPerson:
    """Draw a person: resting faces differ more between people than load changes one face."""
    neutral = np.clip(rng.gamma(1.5, 0.06, N_AU), 0.0, 0.5)
    neutral[_IDX["AU4"]] += rng.uniform(0.0, 0.25)  # some people frown at rest
    neutral[_IDX["AU12"]] += rng.uniform(0.0, 0.15)  # some smile at rest
    return SyntheticPerson(
        neutral=neutral.astype(np.float32),
        gain=float(rng.uniform(0.9, 1.1)),
        signature_scale=np.exp(rng.normal(0.0, 0.12, N_AU)).astype(np.float32),
        noise=float(rng.uniform(0.01, 0.03)),
        jitter=float(rng.uniform(0.01, 0.025)),
        rate_hz=float(rng.uniform(15.0, 30.0)),
        talkativeness=float(rng.uniform(0.0, 0.5)),
        # some faces change at once, others lag: the network must not extrapolate a slope
        onset_s=0.0 if rng.random() < 0.3 else float(rng.uniform(0.05, 0.4)),
    )


@dataclass(frozen=True)
class Session:
    """One session's samples: times, raw AUs, face flags and labels (-1 = unlabelled)."""

    session_id: str
    pts: np.ndarray  # (n,) seconds, increasing
    au: np.ndarray  # (n, 12) float32
    face: np.ndarray  # (n,) bool
    label: np.ndarray  # (n,) int, -1 where unlabelled

    def samples(self) -> list[AUSample]:
        """The rows as pipeline records (what a controller is fed)."""
        return [
            AUSample(pts=float(t), au=tuple(float(v) for v in a), face=bool(f))
            for t, a, f in zip(self.pts, self.au, self.face, strict=True)
        ]


def _bursts(
    rng: np.random.Generator, t: np.ndarray, rates: np.ndarray, dur: tuple[float, float], amp: tuple[float, float]
) -> np.ndarray:
    """A train of smooth bursts (raised-cosine) whose onset rate follows ``rates`` per sample."""
    out = np.zeros(len(t), dtype=np.float32)
    dt = np.diff(t, prepend=t[0])
    starts = np.flatnonzero(rng.random(len(t)) < rates * dt)
    for s in starts:
        d = rng.uniform(*dur)
        a = rng.uniform(*amp)
        sel = slice(s, int(np.searchsorted(t, t[s] + d)))
        phase = (t[sel] - t[s]) / d
        out[sel] = np.maximum(out[sel], a * np.sin(np.pi * phase) ** 2)
    return out


def synthetic_session(
    rng: np.random.Generator,
    person: SyntheticPerson,
    levels: Sequence[tuple[int, float]],
    session_id: str = "synthetic",
    rest_s: float = 6.0,
    step_onset: bool = False,
    dropouts: bool = True,
) -> Session:
    """Simulate one session: ``rest_s`` of neutral rest (level 0), then ``(level, seconds)`` segments.

    With ``step_onset`` the face switches pattern instantly at segment boundaries (a step change);
    otherwise it follows the load with the person's onset time constant.
    """
    plan = [(0, rest_s), *levels]
    total = sum(d for _, d in plan)
    n = int(total * person.rate_hz)
    t = np.cumsum(rng.uniform(0.85, 1.15, n) / person.rate_hz)
    t = t[t < total]
    n = len(t)
    bounds = np.cumsum([d for _, d in plan])
    label = np.array([plan[min(int(np.searchsorted(bounds, x, side="right")), len(plan) - 1)][0] for x in t])
    frac = np.asarray(LEVEL_FRACTION)[label]
    if not step_onset and person.onset_s > 0:  # first-order lag of the expressed load behind the true load
        dt = np.diff(t, prepend=t[0])
        lagged = np.empty(n)
        acc = 0.0
        for i in range(n):
            acc += (1.0 - math.exp(-dt[i] / person.onset_s)) * (frac[i] - acc)
            lagged[i] = acc
        frac = lagged
    signature = np.array([LOAD_SIGNATURE[a] for a in AU_NAMES], dtype=np.float32) * person.signature_scale
    au = person.neutral[None, :] + person.gain * frac[:, None] * signature[None, :]
    # slow noise: AR(1) with ~0.5 s memory, plus a slow shared drift (head pose / lighting)
    rho = math.exp(-1.0 / (0.5 * person.rate_hz))
    ar = np.zeros((n, N_AU), dtype=np.float32)
    eps = rng.normal(0.0, person.noise * math.sqrt(1 - rho**2), (n, N_AU)).astype(np.float32)
    for i in range(1, n):
        ar[i] = rho * ar[i - 1] + eps[i]
    drift = np.cumsum(rng.normal(0.0, 0.0007, n)).astype(np.float32)
    au += ar + drift[:, None] * 0.5
    # phasic events: smiles (AU6+AU12), blinks (AU7 spikes), speech (AU25/AU26)
    smiles = _bursts(rng, t, np.asarray(SMILE_RATE)[label], (1.0, 3.0), (0.2, 0.6)) * person.gain
    au[:, _IDX["AU12"]] += smiles
    au[:, _IDX["AU6"]] += 0.6 * smiles
    blinks = _bursts(rng, t, np.asarray(BLINK_RATE)[label], (0.12, 0.25), (0.15, 0.35))
    au[:, _IDX["AU7"]] += blinks
    au[:, _IDX["AU6"]] += 0.3 * blinks
    speech_rate = np.full(n, person.talkativeness / 1.5)
    speech = _bursts(rng, t, speech_rate, (0.8, 2.5), (0.2, 0.5))
    syll = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6.3))
    au[:, _IDX["AU25"]] += speech * (0.6 + 0.4 * syll)
    au[:, _IDX["AU26"]] += speech * syll * 0.7
    au += rng.normal(0.0, person.jitter, (n, N_AU)).astype(np.float32)
    au = np.clip(au, 0.0, 1.0).astype(np.float32)
    face = np.ones(n, dtype=bool)
    if dropouts:
        for s in np.flatnonzero(rng.random(n) < 0.015 / person.rate_hz):
            face[s : int(np.searchsorted(t, t[s] + rng.uniform(0.1, 0.8)))] = False
        face[t < rest_s] = True  # the baseline period sees a face
    au[~face] = 0.0
    return Session(session_id, t.astype(np.float64), au, face, label.astype(np.int64))


def random_plan(rng: np.random.Generator, duration_s: float) -> list[tuple[int, float]]:
    """Random piecewise-constant load levels, 5-15 s each, always changing level."""
    plan: list[tuple[int, float]] = []
    level = 0
    total = 0.0
    while total < duration_s:
        level = int(rng.choice([x for x in range(N_LEVELS) if x != level]))
        d = float(rng.uniform(5.0, 15.0))
        plan.append((level, d))
        total += d
    return plan


def synthetic_dataset(seed: int, n_persons: int, duration_s: float = 80.0) -> list[Session]:
    """``n_persons`` independent simulated people, one session each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_persons):
        person = random_person(rng)
        out.append(synthetic_session(rng, person, random_plan(rng, duration_s), session_id=f"s{seed}-{i}"))
    return out


# --- windows ----------------------------------------------------------------------------------


def session_windows(
    session: Session,
    steps: int = WINDOW_STEPS,
    hz: float = GRID_HZ,
    baseline_s: float = BASELINE_S,
    stride: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw baseline-relative windows ``(n, steps, 12)``, labels, and seconds since the label changed,
    exactly as the controller sees them.

    Face-less samples are dropped (the controller skips them); windows start after the baseline
    period and only where the sample that ends them is labelled.
    """
    keep = session.face
    ts, au, lab = session.pts[keep], session.au[keep], session.label[keep]
    nb = baseline_count(ts, baseline_s)
    if nb == 0 or nb >= len(ts):
        return np.zeros((0, steps, N_AU), np.float32), np.zeros(0, np.int64), np.zeros(0)
    center = neutral_center(au[:nb])
    span = (steps - 1) / hz
    ends = np.arange(nb, len(ts), stride)
    ends = ends[(lab[ends] >= 0) & (ts[ends] - span >= ts[0])]
    idx = window_indices(ts, ts[ends], steps, hz)
    change_at = np.maximum.accumulate(np.where(np.diff(lab, prepend=lab[0]) != 0, ts, -np.inf))
    return (au[np.maximum(idx, 0)] - center).astype(np.float32), lab[ends], ts[ends] - change_at[ends]


def stack_windows(
    sessions: Iterable[Session], stride: int = 1, steps: int = WINDOW_STEPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All sessions' windows, labels and seconds-since-change, concatenated."""
    parts = [session_windows(s, steps=steps, stride=stride) for s in sessions]
    if not parts:
        return np.zeros((0, steps, N_AU), np.float32), np.zeros(0, np.int64), np.zeros(0)
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


# --- training and evaluation ------------------------------------------------------------------

_TORCH_LOCK = threading.Lock()
TRANSITION_S = 1.0  # windows ending this soon after a level change ...
TRANSITION_WEIGHT = 3.0  # ... count this much more in the loss


def train_model(
    train: Sequence[Session],
    epochs: int = 8,
    seed: int = 0,
    hidden: int = 32,
    batch: int = 256,
    lr: float = 3e-3,
    stride: int = 3,
    steps: int = WINDOW_STEPS,
    log: bool = False,
) -> tuple[LoadNet, np.ndarray]:
    """Fit a ``LoadNet`` on the sessions' windows; returns it and the per-AU feature scale."""
    x, y, since = stack_windows(train, stride=stride, steps=steps)
    if len(x) == 0:
        raise ValueError("no labelled windows to train on (sessions too short or unlabelled)")
    scale = np.maximum(x.reshape(-1, N_AU).std(axis=0), 0.02).astype(np.float32)
    # windows just after a load change are rare but decide the reaction time: weigh them up
    weight = torch.from_numpy(np.where(since < TRANSITION_S, TRANSITION_WEIGHT, 1.0).astype(np.float32))
    threads = torch.get_num_threads()
    with _TORCH_LOCK:
        torch.set_num_threads(1)  # tiny matrices: on 2 shared cores a thread pool only adds contention
        torch.manual_seed(seed)
        net = LoadNet(hidden=hidden)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
        xt = torch.from_numpy(x / scale)
        yt = torch.from_numpy(y)
        gen = torch.Generator().manual_seed(seed)
        loss_fn = nn.CrossEntropyLoss(reduction="none")
        net.train()
        for epoch in range(epochs):
            perm = torch.randperm(len(xt), generator=gen)
            total = 0.0
            for i in range(0, len(perm), batch):
                sel = perm[i : i + batch]
                opt.zero_grad()
                loss = (loss_fn(net(xt[sel]), yt[sel]) * weight[sel]).mean()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(sel)
            sched.step()
            if log:
                print(f"epoch {epoch + 1}/{epochs}: loss {total / len(xt):.4f}", flush=True)
        net.eval()
        torch.set_num_threads(threads)
    return net, scale


def evaluate_windows(model: ControllerModel, sessions: Sequence[Session]) -> dict:
    """Raw window accuracy of the network (no smoothing, no hysteresis)."""
    x, y, _ = stack_windows(sessions, steps=model.window_steps)
    if len(x) == 0:
        return {"windows": 0, "window_accuracy": float("nan")}
    probs = np.concatenate(
        [model.predict_proba(x[i : i + 4096] / model.feature_scale) for i in range(0, len(x), 4096)]
    )
    pred = probs.argmax(axis=1)
    return {"windows": int(len(y)), "window_accuracy": float(np.mean(pred == y))}


def evaluate_controller(model: ControllerModel, sessions: Sequence[Session]) -> dict:
    """Accuracy of the live controller (smoothing + hysteresis) over labelled samples with a face,
    after the baseline; also level changes per minute and per-level accuracy."""
    hits = np.zeros(N_LEVELS)
    counts = np.zeros(N_LEVELS)
    changes = 0
    seconds = 0.0
    for s in sessions:
        ests = LoadController(model).run(s.samples())
        prev: int | None = None
        first: float | None = None
        for t, est, f, lab in zip(s.pts, ests, s.face, s.label, strict=True):
            if est is None:
                continue
            first = float(t) if first is None else first
            if prev is not None and est.level != prev:
                changes += 1
            prev = est.level
            if f and lab >= 0:
                counts[lab] += 1
                hits[lab] += est.level == lab
        if first is not None:
            seconds += float(s.pts[-1]) - first
    total = counts.sum()
    return {
        "samples": int(total),
        "accuracy": float(hits.sum() / total) if total else float("nan"),
        "per_level_accuracy": [float(h / c) if c else float("nan") for h, c in zip(hits, counts, strict=True)],
        "level_changes_per_min": float(changes / seconds * 60.0) if seconds else float("nan"),
    }


def _meta(trained_on: str, epochs: int, seed: int, n_train: int, n_val: int, figures: dict) -> dict:
    return {
        "trained_on": trained_on,
        "epochs": epochs,
        "seed": seed,
        "train_sessions": n_train,
        "val_sessions": n_val,
        "trained_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{k: v for k, v in figures.items() if isinstance(v, (int, float, str))},
    }


def fit_and_save(
    train: Sequence[Session], val: Sequence[Session], out: Path, epochs: int, seed: int, trained_on: str,
    steps: int = WINDOW_STEPS, log: bool = False,
) -> dict:
    """Train, save, reload the saved file and evaluate it (so the figures describe what was written)."""
    net, scale = train_model(train, epochs=epochs, seed=seed, steps=steps, log=log)
    out = Path(out)
    save_checkpoint(out, net, scale, meta={"trained_on": trained_on}, window_steps=steps)
    model = _reload(out)
    figures = {**evaluate_windows(model, val), **evaluate_controller(model, val)}
    meta = _meta(trained_on, epochs, seed, len(train), len(val), figures)
    save_checkpoint(out, net, scale, meta=meta, window_steps=steps)
    _reload(out)
    return {"out": str(out), "train_sessions": len(train), "val_sessions": len(val), "epochs": epochs, **figures}


def _reload(path: Path) -> ControllerModel:
    from models import controller

    with controller._CACHE_LOCK:
        controller._CACHE.pop(str(Path(path).resolve()), None)
    return load_model(path)


# --- CSV I/O ----------------------------------------------------------------------------------


class AUSessionRecorder:
    """Append AU samples (with an optional load label) to a CSV in the training format."""

    def __init__(self, path: str | Path, session_id: str = "session") -> None:
        self.path = Path(path)
        self.session_id = session_id
        self._lock = threading.Lock()
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: io.TextIOWrapper | None = self.path.open("a", newline="")
        self._writer = csv.writer(self._fh)
        if new:
            self._writer.writerow(CSV_COLUMNS)

    def record(self, sample: AUSample, level: int | None) -> None:
        """Write one row; ``level`` None means unlabelled."""
        if level is not None and not 0 <= level < N_LEVELS:
            raise ValueError(f"label must be 0..{N_LEVELS - 1} or None, got {level}")
        with self._lock:
            if self._fh is None:
                raise ValueError("recorder is closed")
            self._writer.writerow(
                [self.session_id, f"{sample.pts:.4f}", *(f"{v:.4f}" for v in sample.au),
                 int(sample.face), "" if level is None else int(level)]
            )

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> AUSessionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_sessions(path: str | Path, sessions: Iterable[Session]) -> None:
    """Write sessions to one CSV (the recorder's format)."""
    Path(path).unlink(missing_ok=True)
    for s in sessions:
        with AUSessionRecorder(path, s.session_id) as rec:
            for smp, lab in zip(s.samples(), s.label, strict=True):
                rec.record(smp, None if lab < 0 else int(lab))


def read_sessions(path: str | Path) -> list[Session]:
    """Parse a session CSV; raises ValueError naming the line and the problem on bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    rows: dict[str, list[tuple[float, list[float], bool, int]]] = {}
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file; expected header {','.join(CSV_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected {','.join(CSV_COLUMNS)}")
        col = {c: header.index(c) for c in CSV_COLUMNS}
        for line, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(header):
                raise ValueError(f"{path}:{line}: expected {len(header)} fields, got {len(row)}")
            try:
                pts = float(row[col["pts"]])
                au = [float(row[col[a]]) for a in AU_NAMES]
                face = int(float(row[col["face"]])) != 0
                raw = row[col["label"]].strip()
                label = -1 if raw == "" else int(raw)
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: not a number ({exc})") from None
            if not (math.isfinite(pts) and all(math.isfinite(v) for v in au)):
                raise ValueError(f"{path}:{line}: non-finite value")
            if label != -1 and not 0 <= label < N_LEVELS:
                raise ValueError(f"{path}:{line}: label must be 0..{N_LEVELS - 1} or empty, got {label}")
            rows.setdefault(row[col["session"]].strip(), []).append((pts, au, face, label))
    if not rows:
        raise ValueError(f"{path}: no data rows")
    sessions = []
    for sid, items in rows.items():
        items.sort(key=lambda r: r[0])
        pts = np.array([r[0] for r in items], dtype=np.float64)
        if np.any(np.diff(pts) <= 0):
            raise ValueError(f"{path}: session {sid!r} has repeated pts values")
        sessions.append(
            Session(
                sid,
                pts,
                np.clip(np.array([r[1] for r in items], dtype=np.float32), 0.0, 1.0),
                np.array([r[2] for r in items], dtype=bool),
                np.array([r[3] for r in items], dtype=np.int64),
            )
        )
    return sessions


def split_sessions(sessions: Sequence[Session], seed: int, val_fraction: float = 0.2) -> tuple[list, list]:
    """Hold out whole sessions (people), never windows of a seen session."""
    if len(sessions) < 2:
        raise ValueError("need at least 2 sessions (one is held out for evaluation)")
    order = np.random.default_rng(seed).permutation(len(sessions))
    n_val = max(1, int(round(len(sessions) * val_fraction)))
    val = [sessions[i] for i in order[:n_val]]
    train = [sessions[i] for i in order[n_val:]]
    return train, val


def train_controller_command(data: Path, out: Path = DEFAULT_WEIGHTS, epochs: int = 10, seed: int = 0) -> dict:
    """``synchrony train-controller``: retrain from a session CSV, save to ``out``, return held-out figures.

    Raises ValueError with a clear message on a bad CSV or too little labelled data (OSError only
    if ``out`` cannot be written). Returns the held-out figures: ``window_accuracy`` (network),
    ``accuracy`` and ``per_level_accuracy`` (live controller), ``level_changes_per_min``, counts.
    """
    sessions = read_sessions(data)
    labelled = [s for s in sessions if np.any(s.label >= 0)]
    if not labelled:
        raise ValueError(f"{data}: no labelled rows (label column is empty everywhere)")
    train, val = split_sessions(labelled, seed)
    if len(stack_windows(val)[0]) == 0:
        raise ValueError(
            f"{data}: held-out sessions give no labelled windows; sessions need > {BASELINE_S:.0f} s "
            "of face samples for the baseline plus labelled samples after it"
        )
    return fit_and_save(train, val, out, epochs, seed, trained_on=f"CSV {Path(data).name}")


# --- shipping the synthetic model -------------------------------------------------------------

SHIP_TRAIN_SEED = 1000
SHIP_VAL_SEED = 2000


def main(argv: Sequence[str] | None = None) -> int:
    """Train the shipped weights on the synthetic generator (documented in the model card)."""
    ap = argparse.ArgumentParser(description="train the load controller on synthetic AU sessions")
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--persons", type=int, default=240)
    ap.add_argument("--val-persons", type=int, default=40)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    train = synthetic_dataset(SHIP_TRAIN_SEED, args.persons)
    val = synthetic_dataset(SHIP_VAL_SEED, args.val_persons)
    print(f"generated {len(train)} + {len(val)} sessions in {time.perf_counter() - t0:.1f} s", flush=True)
    trained_on = (
        f"synthetic generator (models/controller_training.py), {args.persons} persons x 80 s, "
        f"seed {SHIP_TRAIN_SEED}; held out {args.val_persons} persons, seed {SHIP_VAL_SEED}"
    )
    figures = fit_and_save(train, val, args.out, args.epochs, args.seed, trained_on, log=True)
    figures["train_seconds"] = round(time.perf_counter() - t0, 1)
    for k, v in figures.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
