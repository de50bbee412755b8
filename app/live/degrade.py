"""What the server gives up, in order, under a brief overload, so admitted sessions' words stay on time.

Admission (``app.live.cpu_account``) keeps the server from taking sessions it cannot carry; a brief
overload can still come (speech in every session at once, a noisy neighbour). Words are the product,
so the cheaper-to-lose work goes first, one step at a time (docs/WIRE.md, "Under overload"):

1. ``au_rate``: face analysis at 8 instead of 16 frames/s (the controller resamples its window);
2. ``video_quality``: the returned video at half size (same frame rate, times and caption frames);
3. ``asr_step``: the streaming ASR re-decodes every 0.3 s of new speech instead of 0.15 s.

Overload is read from the process's CPU share and from the ASR falling behind (other processes can take
the cores unseen by that share); late words count only while no core is spare (else they are the
recogniser's own waits). After ``enter_s`` of overload it takes the next step; after ``leave_s`` without,
it gives one back. ``synchrony serve --shed N`` takes the first N steps for good (the ``floor``).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.live.stages import Stage

#: The steps, in the order they are taken (and given back in reverse).
ORDER = ("au_rate", "video_quality", "asr_step")
#: Finals later than this share of the output delay (after their word's end) count as overload.
FINAL_SHARE_OF_DELAY = 0.6
#: Late words count as overload only while fewer cores than this sit idle: with a core to spare they are the
#: recogniser's own waits (an utterance's end, an unsure word's guard, speech over the answer), which shedding
#: work cannot bring forward (it only makes decodes rarer), not a CPU short of time.
SPARE_CORES_FOR_LATE_WORDS = 0.5
#: The stage each step sheds work from.
STEP_STAGE: dict[str, Stage] = {"au_rate": Stage.AU, "video_quality": Stage.RENDER, "asr_step": Stage.ASR}


@dataclass(frozen=True)
class Effects:
    """What the current level means for sessions."""

    level: int
    au_fps: float
    output_scale: float  # of the configured output size (width and height)
    asr_step_s: float | None  # None: the configured step


def effects(level: int, au_fps: float = 16.0) -> Effects:
    """The settings in force at ``level`` (0: none of the steps)."""
    return Effects(level=level, au_fps=au_fps / 2 if level >= 1 else au_fps,
                   output_scale=0.5 if level >= 2 else 1.0, asr_step_s=0.3 if level >= 3 else None)


@dataclass(frozen=True)
class OverloadSignal:
    """One second's evidence: the process's CPU rate and the ASR's backlog."""

    cpu_cores: float  # the process's CPU over the last interval
    usable_cores: float
    asr_backlog_s: float  # how long the ASR's oldest queued audio has waited for a decode lane
    word_latency_s: float = 0.0  # median word end → token latency of the last 2 s' tokens, all sessions
    final_latency_s: float = 0.0  # 90th percentile word end → final latency of the last 2 s' finals
    final_limit_s: float = FINAL_SHARE_OF_DELAY * 1.5  # finals later than this put captions at risk
    spare_cores: float = 0.0  # cores left idle over the interval (``cpu_account.SpareCores``; 0: unknown)

    def overloaded(self, cpu_share: float = 0.95, backlog_s: float = 0.3, word_latency_s: float = 0.8) -> bool:
        return bool(self.why(cpu_share, backlog_s, word_latency_s))

    def why(self, cpu_share: float = 0.95, backlog_s: float = 0.3, word_latency_s: float = 0.8) -> list[str]:
        """The criteria that hold, in words (empty: not overloaded), for the log line of a step."""
        out = []
        if self.cpu_cores >= cpu_share * self.usable_cores:
            out.append(f"CPU {self.cpu_cores:.2f} of {self.usable_cores:.2f} cores")
        if self.asr_backlog_s > backlog_s:
            out.append(f"ASR backlog {self.asr_backlog_s:.2f} s")
        if self.spare_cores >= SPARE_CORES_FOR_LATE_WORDS:
            return out
        if self.word_latency_s > word_latency_s:
            out.append(f"median word latency {self.word_latency_s:.2f} s")
        if self.final_latency_s > self.final_limit_s:
            out.append(f"finals p90 {self.final_latency_s:.2f} s > {self.final_limit_s:.2f} s")
        return out


class Degradation:
    """The level of the degradation order in force, stepped by :meth:`update` (about once a second)."""

    def __init__(self, enter_s: float = 1.0, leave_s: float = 5.0, enabled: bool = True, floor: int = 0) -> None:
        """``floor``: steps always taken (``synchrony serve --shed``): the operator's choice of more
        sessions per machine over the full service; overload steps start above it."""
        if not 0 <= floor <= len(ORDER):
            raise ValueError(f"floor must be 0..{len(ORDER)}, got {floor}")
        self.enter_s, self.leave_s, self.enabled, self.floor = enter_s, leave_s, enabled, floor
        self.level = floor
        self._since: float | None = None  # when the current state (overloaded or not) began, or the last step
        self._over = False
        self.steps: list[tuple[float, int]] = []  # (time, new level): what it did, for reports and tests

    def update(self, signal: OverloadSignal, now: float) -> int:
        over = signal.overloaded()
        if over != self._over or self._since is None:
            self._over, self._since = over, now
        if not self.enabled:
            return self.level
        held = now - self._since
        if over and held >= self.enter_s and self.level < len(ORDER):
            self._step(self.level + 1, now)
        elif not over and held >= self.leave_s and self.level > self.floor:
            self._step(self.level - 1, now)
        return self.level

    def reset(self, now: float) -> int:
        """The floor at once: with no sessions there is no overload to shed work for, and a level left
        over from the warm-up or the last overload would only keep the next session out (admission
        takes no one while the server sheds work beyond its floor)."""
        self._over, self._since = False, now
        if self.level != self.floor:
            self._step(self.floor, now)
        return self.level

    @property
    def overloaded(self) -> bool:
        """Work is shed beyond the floor: the server is (or just was) overloaded."""
        return self.level > self.floor

    def _step(self, level: int, now: float) -> None:
        self.level = level
        self._since = now  # the next step needs its own full interval
        if len(self.steps) < 10_000:
            self.steps.append((round(now, 2), level))

    @property
    def effects(self) -> Effects:
        return effects(self.level)
