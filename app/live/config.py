"""What ``synchrony serve`` can set, in one frozen record: the routes, the warm-up and the sessions
read it; the cluster gives the same record to every node's server."""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.live.ice import IceServer
from app.live.stages import Stage

MAX_SDP_BYTES = 64 * 1024
#: CPU (cores) of one full-pipeline session with the load test's clip on a 2-core machine, as
#: ``bench/capacity.py`` measures it (the high end of its rounds, so a fresh server errs towards
#: refusing): the admission estimate until the server has measured its own.
SESSION_COST_CORES = 0.88


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``synchrony serve`` can set; the defaults are what it runs with no arguments (a test reads
    them off the CLI). Servers inside a test's or a bench's own process start from :meth:`in_process`."""

    max_sessions: int = 4
    video_backend: str = "overlay"
    svd_model: str | None = None
    responder: str = "assistant"
    llm_url: str | None = None
    whisper_path: str | None = None
    auth_token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    metrics_auth: bool = False  # /metrics and /metrics/lst ask for the bearer token too (``--protect-metrics``)
    # ICE servers (``--ice-server``, app.live.ice.IceServer): the server's own ICE agent uses them, and WHIP
    # clients are told them in ``Link: <...>; rel="ice-server"`` headers (RFC 9725 section 4.6)
    ice_servers: tuple[IceServer, ...] = ()
    turn_secret: str | None = None  # coturn's static-auth-secret: short-lived TURN credentials per offer
    turn_ttl_s: int = 3600  # how long such credentials stay valid
    ice_relay_only: bool = False  # the server's own agent offers relay candidates only (tests, strict NAT)
    # proxies whose X-Forwarded-For/-Proto/-Host/-Prefix are believed ("*": any; app.live.proxy)
    forwarded_allow_ips: tuple[str, ...] = ()
    # WHIP offers per client address: a bucket of ``offer_burst`` refilled at ``offer_rate_per_s`` (0: no
    # limit); over it, 429 + Retry-After
    offer_rate_per_s: float = 1.0
    offer_burst: int = 10
    # what one session may cost whatever its sender sends (app.live.ingest): camera frames above this size are
    # scaled down and above this rate dropped before the face stage; incoming RTP above the bitrate is dropped
    max_video_size: tuple[int, int] = (1280, 720)
    max_video_fps: float = 30.0
    max_bitrate_kbps: int = 4000
    output_delay_s: float = 1.5  # > final-word latency p95 (bench/asr_stream.py), so captions land on their frames
    output_size: tuple[int, int] = (640, 360)
    media_timeout_s: float = 10.0
    asr_lanes: int = 2  # decode threads sharing the sessions (one per core: decodes of different sessions overlap)
    # each lane decodes in a child process: decoding in the server's process makes the event loop and the
    # other stages wait for the interpreter lock (models/asr/worker.py)
    asr_processes: bool = True
    # "measured": admit as many as the measured CPU per session allows; "fixed": max_sessions
    admission: str = "measured"
    session_cost_cores: float = SESSION_COST_CORES  # CPU per session until this server has measured its own
    target_utilisation: float = 0.85  # of the usable cores, for admitted sessions
    retry_after_s: int = 5  # Retry-After of a 503 when full
    # under a brief overload, shed work in app.live.degrade.ORDER before words run late
    degrade: bool = True
    # steps of that order always taken (``--shed N``): cheaper sessions, so more of them per machine
    # (BENCHMARKS.md, issue 20), for a lower AU rate, a smaller returned video and later finals
    shed_steps: int = 0
    turn_end_s: float = 0.3  # silence that ends a user's turn (app/live/turns.py); 0: the ASR's endpoint decides
    turn_unfinished_end_s: float = 0.6  # ... after a word a sentence rarely ends on
    max_sdp_bytes: int = MAX_SDP_BYTES
    # Spoken answers (app/live/answer.py): "festival", "openai" (an OpenAI-compatible /audio/speech at
    # tts_url) or "off"
    tts: str = "festival"
    tts_url: str | None = None
    tts_voice: str | None = None  # festival voice / OpenAI voice name (None: the engine's default)
    avatar: bool = True  # send the avatar on a second video m-line when the client offers one
    history_turns: int = 8  # earlier turns a responder sees (user words + the spoken prefix of each answer)
    # TEST ONLY (no CLI flag): the avatar drawn this many seconds behind the audio it is stamped with,
    # the injected shift that the answer's Level-3 (``answer_sync``) must catch.
    avatar_shift_s: float = 0.0
    ui: bool = True  # mount the Gradio page at /
    warmup: bool = True  # load and run every model before /readyz says ready
    stages: tuple[Stage, ...] = (Stage.FACES, Stage.CONTROLLER, Stage.ASR, Stage.RENDER, Stage.SYNC, Stage.RESPONSE,
                                 Stage.LST)

    @classmethod
    def in_process(cls, **changes: object) -> ServerConfig:
        """The preset of a server inside a test's or a bench's own process (and of the replay check), with
        ``changes`` on top: lanes as threads (one process starts fast), ``max_sessions`` admitted and no
        shedding (its CPU includes its own test peers), no offer limit, and text answers echoing the
        transcript (``caption``), so its events stay those the tests and the replay baseline expect."""
        return replace(IN_PROCESS, **changes)


#: The in-process preset (:meth:`ServerConfig.in_process`).
IN_PROCESS = ServerConfig(responder="caption", asr_processes=False, admission="fixed", degrade=False,
                          offer_rate_per_s=0.0, tts="off")
