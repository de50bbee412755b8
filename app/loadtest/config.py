"""What a load-test round is: its peers (``PeerSpec``), what they share (``RoundConfig``), the tool's limits.

Plain frozen data, so a round's plan can cross into the worker processes (``spawn``) and into the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.loadtest.verdict import RECALL_BOUND

MAX_PEERS = 64
MAX_WORKERS = 8
MAX_ROUNDS = 16
EXIT_OK, EXIT_BOUND, EXIT_USAGE, EXIT_SERVER = 0, 1, 2, 3

DEFAULT_TEXT = "please call me back when you have a moment"  # tiny.en hears espeak say this right
#: The peers' voice: festival's kal_diphone, not the answers' voice (slt_hts), so a peer's own speech and
#: the answer's echo of it can be told apart by ear and by the server's ASR alike.
DEFAULT_VOICE = "festival:kal_diphone"
#: The peers' microphone noise floor (white, RMS dBFS): a live mic always carries some, and a browser sends it. A mic
#: that sends digital silence reads to the server as a muted or gated sender, whose silence says nothing about echo,
#: so the suppressor keeps its prior under the answer and floors the first words a peer says over it
#: (``alignment.echo.EchoConfig.cap_mic_db``). ``None``: digital silence between utterances.
DEFAULT_MIC_NOISE_DBFS = -70.0


@dataclass(frozen=True)
class PeerSpec:
    """One simulated peer: which worker runs it, when it starts, its A/V offset and network."""

    index: int
    worker: int
    start_s: float
    offset_ms: float = 0.0
    netem: str = "clean"


@dataclass(frozen=True)
class RoundConfig:
    """What every peer of one round shares."""

    url: str
    duration_s: float = 20.0
    connect_timeout_s: float = 20.0
    text: str = DEFAULT_TEXT
    video_size: tuple[int, int] = (640, 360)
    fps: float = 25.0
    seed: int = 0
    token: str | None = None
    max_duration_s: float = 0.0  # > duration_s: keep streaming until min_sync_checks evidence checks came
    min_sync_checks: int = 0
    settle_s: float = 0.0  # words starting before this (peer clock) are not scored
    pre_encode: bool = True  # replay VP8 and Opus encoded once per worker (False: encode per frame, per peer)
    decode_video: bool = False  # decode the returned video and time its flashes (False: count its RTP frames)
    allow_refusals: bool = False  # a peer refused with 503 + Retry-After does not fail the round
    min_recall: float = RECALL_BOUND
    require_lst: str | None = None  # also require this LST tier (alignment.lst) of the round's responses
    tail_s: float = 3.0  # words ending in the last tail_s are not scored: their tokens may still be on the way
    voice: str = DEFAULT_VOICE  # an espeak-ng voice, or festival:<voice> (app.loadtest.testmedia.speak)
    mic_noise_dbfs: float | None = DEFAULT_MIC_NOISE_DBFS  # the peers' mic noise floor (None: digital silence)
    answer_video: bool = True  # offer the avatar's recvonly video m-line (wire v2)
    decode_answer: bool = False  # decode and measure the spoken answer (False: count its packets)


def plan_peers(n: int, workers: int, stagger_s: float, offsets: dict[int, float], netem: str,
               netem_peers: set[int] | None = None) -> list[PeerSpec]:
    """Spread ``n`` peers round-robin over ``workers``; peer i starts ``i·stagger_s`` after the round."""
    return [PeerSpec(i, i % workers, round(i * stagger_s, 3), offsets.get(i, 0.0),
                     netem if netem_peers is None or i in netem_peers else "clean") for i in range(n)]
