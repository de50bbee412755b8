"""A WHIP client peer (aiortc) that sends generated media and records what comes back.

Used by the tests, ``bench/live.py`` and the load tester, so every live claim is measured through
the real WebRTC stack over loopback. The API is deliberately small:

    peer = WhipPeer("http://127.0.0.1:8000/whip", clip)   # clip: app.loadtest.testmedia.AVClip
    await peer.connect()          # POST the offer, apply the answer; media starts flowing
    await peer.wait_for("token", lambda m: m["final"], timeout=10)
    peer.events                   # [ReceivedEvent(wall, message)] in arrival order
    peer.frames_received          # count of returned video frames; peer.last_frames: a few, as RGB
    peer.sent_video_wall(pts)     # wall time the frame at clip time ``pts`` was handed to the encoder
    peer.answer                   # AnswerListener: the spoken answer's audio and avatar (voicepeer.py)
    await peer.close()            # DELETE the session, close the peer connection
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import functools
import json
import re
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from alignment.json_types import JsonObject
from alignment.types import SAMPLE_RATE
from app.live.ice import is_loopback_url, loopback_candidates
from app.live.webrtc import patient_consent, share_transport
from app.loadtest.voicepeer import AnswerListener, ScriptedMic, Utterance, answer_figures

if TYPE_CHECKING:
    from aiortc import RTCRtpTransceiver
    from aiortc.rtp import RtpPacket

    from app.loadtest.answers import EchoPath
    from app.loadtest.testmedia import AVClip

AUDIO_RATE = 48_000
AUDIO_FRAME = 960  # 20 ms at 48 kHz
VIDEO_CLOCK = 90_000


@dataclass(frozen=True)
class ReceivedEvent:
    """One JSON message from the server's ``events`` channel and its arrival wall time."""

    wall: float
    message: JsonObject = field(repr=False)

    @property
    def type(self) -> str:
        return str(self.message.get("type", ""))


class WhipError(RuntimeError):
    """The server refused the offer; ``status`` is the HTTP status, ``detail`` its message."""

    def __init__(self, status: int, detail: str, retry_after: str | None = None) -> None:
        super().__init__(f"WHIP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process: each client would otherwise load the CA
    bundle again (~30 ms of CPU), twice per peer (the offer and the DELETE)."""
    return httpx.create_ssl_context()


_HTTP_TRANSPORT_MODULES = ("httpcore._async.http11", "httpcore._backends.anyio", "anyio._backends._asyncio")


def warm_http_client() -> None:
    """Pay the WHIP client's once-per-process costs now: the TLS context, and the transport modules
    httpx imports at its first request (httpcore, h11, anyio: ~70 modules, ~0.07 CPU-s). A load-test
    worker calls this while it builds its clips, so its peers' CPU is what each peer costs."""
    import importlib

    for name in _HTTP_TRANSPORT_MODULES:  # httpx's dependencies' internals: best effort
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _tls_context()


def parse_ice_links(values: list[str]) -> list[dict[str, str]]:
    """RFC 9725 ``Link: <url>; rel="ice-server"; username=..; credential=..`` values → ICE server dicts."""
    servers = []
    for value in values:
        for part in re.split(r",\s*(?=<)", value):
            m = re.match(r"\s*<([^>]+)>(.*)$", part)
            if m is None:
                continue
            params = {k.lower(): (re.sub(r"\\(.)", r"\1", q) if q else t) for k, q, t in
                      re.findall(r';\s*([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;,\s]+))', m.group(2))}
            if params.get("rel") != "ice-server":
                continue
            server = {"urls": m.group(1)}
            if "username" in params:
                server["username"], server["credential"] = params["username"], params.get("credential", "")
            servers.append(server)
    return servers


class _Start:
    """The shared instant clip time zero is sent; set by whichever track is pulled first."""

    def __init__(self) -> None:
        self.wall: float | None = None

    def get(self) -> float:
        if self.wall is None:
            self.wall = time.monotonic()
        return self.wall

    async def sleep_until(self, t: float) -> None:
        delay = self.get() + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class ClipAudioTrack(MediaStreamTrack):
    """16 kHz clip audio, upsampled to 48 kHz and sent as 20 ms s16 frames with sample-count pts."""

    kind = "audio"

    def __init__(self, samples16k: np.ndarray, start: _Start, loop: bool = False) -> None:
        super().__init__()
        from app.loadtest.testmedia import resample

        pcm = resample(np.asarray(samples16k, np.float32), SAMPLE_RATE, AUDIO_RATE)
        self._pcm = (np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        self._start = start
        self._loop = loop
        self._n = 0  # frames sent

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        pts = self._n * AUDIO_FRAME
        await self._start.sleep_until(pts / AUDIO_RATE)
        i = pts % len(self._pcm) if self._loop and len(self._pcm) else pts
        chunk = self._pcm[i : i + AUDIO_FRAME]
        if len(chunk) < AUDIO_FRAME:
            chunk = np.concatenate([chunk, np.zeros(AUDIO_FRAME - len(chunk), np.int16)])
        frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = pts
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        self._n += 1
        return frame


class ClipVideoTrack(MediaStreamTrack):
    """Clip frames at the clip's fps with 90 kHz pts; records the wall time each frame was sent."""

    kind = "video"

    def __init__(self, frames: list[np.ndarray], fps: float, start: _Start, loop: bool = False) -> None:
        super().__init__()
        if not frames:
            raise ValueError("a video track needs at least one frame")
        self._frames = [av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p") for f in frames]
        self._fps = float(fps)
        self._start = start
        self._loop = loop
        self._n = 0
        self.sent: deque[tuple[float, float]] = deque(maxlen=20_000)  # (clip time, wall)

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        t = self._n / self._fps
        await self._start.sleep_until(t)
        k = self._n % len(self._frames) if self._loop else min(self._n, len(self._frames) - 1)
        src = self._frames[k]
        frame = av.VideoFrame(src.width, src.height, "yuv420p")
        for dst_plane, src_plane in zip(frame.planes, src.planes, strict=True):
            dst_plane.update(bytes(src_plane))
        frame.pts = int(round(t * VIDEO_CLOCK))
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent.append((t, time.monotonic()))
        self._n += 1
        return frame


class WhipPeer:
    """An aiortc peer that publishes a clip over WHIP and collects the server's video and events.

    With ``answer_video=True`` the offer carries the extra recvonly video m-line the server sends the
    avatar on (wire v2); the answer's audio always comes back on the audio m-line. ``decode_answer``
    decodes both and measures them (levels, mouth opening, one clock through the sender reports);
    without it the answer's packets are only counted. Audio goes as 20 ms frames at 48 kHz, video at
    the clip's fps, both paced from one start instant (``t0_wall``): clip time t is sent at
    ``t0_wall + t``. After the clip the peer sends silence and the last frame until closed, unless
    ``loop=True``. Wall times are ``time.monotonic()`` (comparable across processes on one machine).
    """

    def __init__(
        self,
        url: str,
        clip: AVClip | None = None,
        *,
        token: str | None = None,
        keep_frames: int = 4,
        loop: bool = False,
        audio: np.ndarray | None = None,
        frames: list[np.ndarray] | None = None,
        fps: float | None = None,
        answer_video: bool = False,
        decode_answer: bool = True,
        echo: EchoPath | None = None,
        ice_from_server: bool = False,
        relay: bool = False,
        cafile: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        """``clip`` is an ``app.loadtest.testmedia.AVClip``; or pass ``audio`` (16 kHz) / ``frames`` + ``fps``.

        ``echo``: an ``app.loadtest.answers.EchoPath`` the listener plays the received answer into.
        ``ice_from_server``: use the STUN/TURN servers the server names (``OPTIONS`` → ``Link`` headers, RFC 9725),
        as the page does; ``relay``: offer relay candidates only (media through TURN). ``cafile``: trust
        this certificate (a server with a self-signed one). ``traceparent``: a W3C trace context for the
        WHIP POST (the session's trace joins it)."""
        self.url = url
        self.token = token
        self.traceparent = traceparent
        self.ice_from_server = ice_from_server or relay
        self.relay = relay
        self._verify: ssl.SSLContext = ssl.create_default_context(cafile=cafile) if cafile else _tls_context()
        self.ice_servers: list[dict[str, str]] = []
        audio = clip.audio if clip is not None and audio is None else audio
        frames = clip.frames if clip is not None and frames is None else frames
        fps = clip.fps if clip is not None and fps is None else fps
        self._start = _Start()
        loopback_candidates(is_loopback_url(url))  # media to a loopback server stays on loopback
        patient_consent()  # a loaded server answers consent checks late (see app/live/webrtc.py)
        self.pc = RTCPeerConnection()
        self.answer_video = answer_video
        self.echo = echo
        self.answer = AnswerListener(decode=decode_answer, echo=echo, t0=lambda: self._start.wall)
        self._avatar_transceiver: RTCRtpTransceiver | None = None
        self.audio_track = self._audio_track(audio, loop) if audio is not None else None
        self.video_track = self._video_track(frames, float(fps or 25.0), loop) if frames else None
        self.events: list[ReceivedEvent] = []
        self.frames_received = 0
        self.last_frames: deque[av.VideoFrame] = deque(maxlen=max(keep_frames, 1))
        self.first_frame_wall: float | None = None
        self.location: str | None = None
        self.session_id: str | None = None
        self.channel_open = asyncio.Event()
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    def _audio_track(self, samples16k: np.ndarray, loop: bool) -> MediaStreamTrack:
        """The track that sends the clip's audio (a subclass may send it pre-encoded instead)."""
        return ClipAudioTrack(samples16k, self._start, loop)

    def _video_track(self, frames: list[np.ndarray], fps: float, loop: bool) -> MediaStreamTrack:
        """The track that sends the clip's frames (a subclass may send them pre-encoded instead)."""
        return ClipVideoTrack(frames, fps, self._start, loop)

    # --- lifecycle --------------------------------------------------------------------------

    async def connect(self, timeout: float = 15.0) -> None:
        """Send the offer (audio + video sendrecv, DataChannel ``events``) and apply the answer."""
        if self.ice_from_server:
            await self._use_server_ice(timeout)
        channel = self.pc.createDataChannel("events")
        channel.on("open", self.channel_open.set)
        channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        for track in (self.audio_track, self.video_track):
            if track is not None:
                self.pc.addTransceiver(track, direction="sendrecv")
        if self.video_track is None:
            self.pc.addTransceiver("video", direction="recvonly")
        if self.answer_video:  # wire v2: the avatar comes back on a video m-line of its own
            self._avatar_transceiver = self.pc.addTransceiver("video", direction="recvonly")
        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Content-Type": "application/sdp"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.traceparent:
            headers["traceparent"] = self.traceparent
        async with httpx.AsyncClient(timeout=timeout, verify=self._verify) as client:
            resp = await client.post(self.url, content=self.pc.localDescription.sdp, headers=headers)
        if resp.status_code != 201:
            await self.pc.close()
            raise WhipError(resp.status_code, resp.text.strip(), resp.headers.get("Retry-After"))
        self.location = str(httpx.URL(self.url).join(resp.headers["Location"]))
        self.session_id = self.location.rstrip("/").rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(resp.text, "answer"))
        if self._avatar_transceiver is not None:  # aiortc leaves a second video m-line off the bundle
            camera = next(t for t in self.pc.getTransceivers() if t.kind == "video")
            share_transport(self._avatar_transceiver, camera)
        await asyncio.wait_for(self.channel_open.wait(), timeout)

    async def _use_server_ice(self, timeout: float) -> None:
        """Rebuild the (still empty) peer connection with the ICE servers ``OPTIONS`` names."""
        from aiortc import RTCConfiguration, RTCIceServer
        from aiortc.rtcconfiguration import RTCIceTransportPolicy

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(timeout=timeout, verify=self._verify) as client:
            resp = await client.options(self.url, headers=headers)
        if resp.status_code not in (200, 204):
            raise WhipError(resp.status_code, resp.text.strip(), resp.headers.get("Retry-After"))
        self.ice_servers = parse_ice_links(resp.headers.get_list("link"))
        servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
                   for s in self.ice_servers]
        policy = RTCIceTransportPolicy.RELAY if self.relay else RTCIceTransportPolicy.ALL
        await self.pc.close()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers, iceTransportPolicy=policy))

    async def close(self, delete: bool = True) -> int | None:
        """End the session: ``DELETE`` its resource (returns the status) and close the connection."""
        if self._closed:
            return None
        self._closed = True
        status = None
        if delete and self.location:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            try:
                async with httpx.AsyncClient(timeout=5.0, verify=self._verify) as client:
                    status = (await client.delete(self.location, headers=headers)).status_code
            except httpx.HTTPError:
                status = None
        for task in self._tasks:
            task.cancel()
        await self.answer.aclose()
        await self.pc.close()
        return status

    async def __aenter__(self) -> WhipPeer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- what came back ---------------------------------------------------------------------

    @property
    def t0_wall(self) -> float | None:
        """Wall time (monotonic) at which clip time zero was sent."""
        return self._start.wall

    def of_type(self, kind: str) -> list[JsonObject]:
        """Messages of one ``type``, in arrival order."""
        return [e.message for e in self.events if e.type == kind]

    def sent_video_wall(self, pts: float) -> float | None:
        """Wall time at which the video frame nearest clip time ``pts`` was sent (None if not sent)."""
        if self.video_track is None or not self.video_track.sent:
            return None
        best = min(self.video_track.sent, key=lambda tw: abs(tw[0] - pts))
        return best[1] if abs(best[0] - pts) <= 1.0 / self.video_track._fps else None

    def frame_images(self) -> list[np.ndarray]:
        """The last few returned video frames as RGB arrays."""
        return [f.to_ndarray(format="rgb24") for f in list(self.last_frames)]

    async def wait_for(
        self, kind: str, predicate: Callable[[JsonObject], bool] | None = None, timeout: float = 10.0
    ) -> JsonObject:
        """The first message of ``kind`` matching ``predicate``; TimeoutError if none arrives in time."""
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e.type == kind and (predicate is None or predicate(e.message)):
                    return e.message
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind!r} event within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass

    async def wait_frames(self, n: int, timeout: float = 10.0) -> int:
        """Wait until at least ``n`` video frames came back; returns the count."""
        deadline = time.monotonic() + timeout
        while self.frames_received < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.frames_received} of {n} video frames within {timeout} s")
            await asyncio.sleep(0.05)
        return self.frames_received

    # --- internals --------------------------------------------------------------------------

    def _on_message(self, data: str | bytes) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            return
        if isinstance(message, dict):
            self.events.append(ReceivedEvent(time.monotonic(), message))
            self._changed.set()

    def _receiver_of(self, track: MediaStreamTrack) -> RTCRtpTransceiver | None:
        return next((t for t in self.pc.getTransceivers() if t.receiver.track is track), None)

    def _on_track(self, track: MediaStreamTrack) -> None:
        transceiver = self._receiver_of(track)
        if track.kind == "audio" and transceiver is not None:
            self.answer.attach_audio(track, transceiver.receiver)
            return
        if track.kind == "video" and transceiver is not None and transceiver is self._avatar_transceiver:
            self.answer.attach_avatar(track, transceiver.receiver)
            return
        if track.kind == "video":
            self._tasks.append(asyncio.ensure_future(self._read_video(track)))
        else:
            self._tasks.append(asyncio.ensure_future(self._drain(track)))

    async def _read_video(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                if self.first_frame_wall is None:
                    self.first_frame_wall = time.monotonic()
                self.frames_received += 1
                self.last_frames.append(frame)
        except (MediaStreamError, asyncio.CancelledError):
            return

    async def _drain(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()
        except (MediaStreamError, asyncio.CancelledError):
            return


class VoicePeer(WhipPeer):
    """A peer that speaks on cue (``say``) through a :class:`ScriptedMic` and listens to and watches the
    answers (``answer``); it asks for the avatar. Its camera is ``frames`` looped."""

    def __init__(self, url: str, frames: list[np.ndarray], fps: float = 25.0, decode_camera: bool = True,
                 mic_noise_dbfs: float | None = None, **kwargs: object) -> None:
        """``decode_camera=False``: the returned camera's frames are counted from RTP, not decoded;
        ``mic_noise_dbfs``: the microphone's noise floor (:class:`ScriptedMic`), none (zeros) by default."""
        kwargs.setdefault("answer_video", True)
        self.mic_noise_dbfs = mic_noise_dbfs
        super().__init__(url, audio=np.zeros(AUDIO_FRAME, np.float32), frames=frames, fps=fps, loop=True, **kwargs)
        self.decode_camera = decode_camera
        self.said: list[Utterance] = []

    def _on_track(self, track: MediaStreamTrack) -> None:
        transceiver = self._receiver_of(track)
        if (track.kind == "video" and not self.decode_camera and transceiver is not None
                and transceiver is not self._avatar_transceiver):
            async def count(packet: RtpPacket, arrival_time_ms: int) -> None:
                if packet.marker and packet.payload:
                    self.frames_received += 1

            transceiver.receiver._handle_rtp_packet = count
            return
        super()._on_track(track)

    def _audio_track(self, samples16k: np.ndarray, loop: bool) -> MediaStreamTrack:
        return ScriptedMic(self._start, self.echo, self.mic_noise_dbfs)

    @property
    def mic(self) -> ScriptedMic:
        assert isinstance(self.audio_track, ScriptedMic)
        return self.audio_track

    def say(self, samples16k: np.ndarray, text: str = "", at_s: float | None = None,
            barge_in: bool = False, phones: tuple[float, float] | None = None) -> Utterance:
        """Schedule an utterance (16 kHz); returns its true onset and end of speech on the peer clock
        (``ScriptedMic.say``: ``phones`` bounds them by the synthesizer's own phones)."""
        utt = self.mic.say(samples16k, text, at_s, barge_in, phones)
        self.said.append(utt)
        return utt

    def figures(self) -> list[dict[str, Any]]:
        """Per-answer figures so far (``app.loadtest.voicepeer.answer_figures``)."""
        if self.t0_wall is None:
            raise RuntimeError("the peer has not started sending")
        return answer_figures(self.answer, self.events, self.said, self.t0_wall)


async def _main(argv: list[str] | None = None) -> None:
    """Publish a generated clip until killed: ``python -m app.loadtest.peer URL`` (prints the session URL)."""
    import argparse
    import sys

    from app.loadtest import testmedia

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("url")
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    clip = testmedia.make_av_clip()
    peer = WhipPeer(args.url, clip, token=args.token, loop=True)
    await peer.connect()
    print(peer.location, flush=True)
    sys.stdout.flush()
    while True:
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(_main())
