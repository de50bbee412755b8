"""The `synchrony` command: analyze a recording, serve live sessions (one server or a Ray cluster),
load-test, probe and certify LST, retrain the controller.

Exit codes scripts can rely on: 0 done; 1 internal error; 2 bad input or usage (nothing written);
3 partial result written (e.g. a recording without audio or without video).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.exit_codes import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_OK
from app.live.config import ServerConfig
from app.live.stages import Stage

if TYPE_CHECKING:
    import socket

    from app.live.ice import IceServer
    from app.live.server import Tls

log = logging.getLogger("synchrony")
_PRODUCT = ServerConfig()  # the server options' defaults (tests/test_cli.py: serve with no arguments runs it)


def _analyze(args: argparse.Namespace) -> int:
    from app.offline.analyze import AnalyzeOptions, analyze
    from app.offline.media_io import MediaError
    from app.offline.report import summary
    from models.video import RendererUnavailable

    options = AnalyzeOptions(
        out_dir=Path(args.out),
        whisper_path=args.whisper,
        write_video=not args.no_video,
        record_au_csv=args.record_au,
        video_backend=args.video_backend,
        svd_model=args.svd_model,
    )
    try:
        report, code = analyze(args.input, options)
    except (MediaError, RendererUnavailable) as exc:
        print(f"synchrony analyze: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(summary(report))
    print(f"report: {options.out_dir / 'report.json'}"
          + (f"  video: {options.out_dir / 'annotated.mp4'}" if options.write_video else ""))
    return code


class UsageError(ValueError):
    """Options that cannot run together (printed as one line, exit code 2)."""


def _ice_servers(args: argparse.Namespace) -> tuple[IceServer, ...]:
    from app.live.ice import parse_ice_server

    try:
        return tuple(parse_ice_server(url) for url in args.ice_server)
    except ValueError as exc:
        raise UsageError(f"--ice-server: {exc}") from None


def check_exposure(host: str, config: ServerConfig, no_auth: bool, command: str) -> None:
    """Off loopback a token is required (``--auth-token`` / $SYNCHRONY_TOKEN) unless ``--no-auth``
    says serving openly is meant; then a warning. ``UsageError`` when it is missing."""
    from app.live.ice import is_loopback_host

    if config.auth_token and no_auth:
        raise UsageError("--no-auth and a token (--auth-token or $SYNCHRONY_TOKEN) contradict each other")
    if config.metrics_auth and not config.auth_token:
        raise UsageError("--protect-metrics needs a token (--auth-token or $SYNCHRONY_TOKEN)")
    if is_loopback_host(host) or config.auth_token:
        return
    if not no_auth:
        raise UsageError(f"refusing to serve on {host} without a token: anyone who reaches the port could stream "
                         "a camera and microphone into it. Pass --auth-token TOKEN (or set SYNCHRONY_TOKEN), or "
                         "--no-auth to serve openly anyway (docs/DEPLOY.md)")
    log.warning("serving on %s with NO token (--no-auth): anyone who reaches this port can open sessions "
                "(each costs most of a core); limited to %g offers/s per address", host, config.offer_rate_per_s)
    print(f"synchrony {command}: WARNING: no token (--no-auth); anyone who reaches {host} can open sessions",
          file=sys.stderr)


def _tls(args: argparse.Namespace) -> Tls | None:
    from app.live.server import Tls

    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if not args.tls_cert:
        return None
    tls = Tls(Path(args.tls_cert), Path(args.tls_key))
    try:
        tls.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return tls


def server_config(args: argparse.Namespace, ui: bool = True) -> ServerConfig:
    """The ``ServerConfig`` that ``serve`` runs, and that ``cluster`` runs on every node."""
    if args.tts == "openai" and not args.tts_url:
        raise UsageError("--tts openai needs --tts-url (an OpenAI-compatible base URL, e.g. http://host/v1)")
    if args.offer_rate < 0 or args.offer_burst < 1:
        raise UsageError("--offer-rate must be >= 0 and --offer-burst >= 1")
    if args.ice_relay_only and not any(url.startswith("turn") for url in args.ice_server):
        raise UsageError("--ice-relay-only needs a TURN server (--ice-server turn:...)")
    return ServerConfig(
        max_sessions=args.max_sessions,
        video_backend=args.video_backend,
        svd_model=args.svd_model,
        responder=args.responder,
        llm_url=args.llm_url,
        whisper_path=args.whisper,
        auth_token=args.auth_token or os.environ.get("SYNCHRONY_TOKEN") or None,
        allowed_origins=tuple(args.allowed_origin),
        output_delay_s=args.output_delay,
        media_timeout_s=args.media_timeout,
        asr_lanes=args.asr_lanes,
        ui=ui,
        admission=args.admission,
        shed_steps=args.shed,
        **({"session_cost_cores": args.session_cost} if args.session_cost else {}),
        turn_end_s=args.turn_end_silence,
        turn_unfinished_end_s=args.turn_unfinished_silence,
        tts=args.tts,
        tts_url=args.tts_url,
        tts_voice=args.tts_voice,
        metrics_auth=args.protect_metrics,
        ice_servers=_ice_servers(args),
        turn_secret=args.turn_secret or os.environ.get("SYNCHRONY_TURN_SECRET") or None,
        turn_ttl_s=args.turn_ttl,
        ice_relay_only=args.ice_relay_only,
        forwarded_allow_ips=tuple(args.forwarded_allow_ip),
        offer_rate_per_s=args.offer_rate,
        offer_burst=args.offer_burst,
    )


def _listen(args: argparse.Namespace, command: str) -> socket.socket | None:
    """The server's socket on ``--host``/``--port``, bound before any model or node starts; None (and one line
    saying why) when the address is taken or not this machine's. From here on a SIGTERM stops the server through
    its shutdown, even one that arrives while it starts."""
    from app.live.server import listening_socket, stop_gracefully_on_sigterm

    try:
        sock = listening_socket(args.host, args.port)
    except OSError as exc:
        hint = {errno.EADDRINUSE: " (another server there? choose another --port)",
                errno.EADDRNOTAVAIL: " (not an address of this machine; --host 0.0.0.0 listens on all of them)",
                errno.EACCES: " (ports below 1024 need privileges; choose another --port)"}.get(exc.errno or 0, "")
        print(f"synchrony {command}: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}{hint}",
              file=sys.stderr)
        return None
    stop_gracefully_on_sigterm()  # only for a server that will run (not for a caller whose bind failed)
    return sock


def _serve(args: argparse.Namespace) -> int:
    try:
        config = server_config(args)
    except UsageError as exc:
        print(f"synchrony serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run_server(args, config)


def run_server(args: argparse.Namespace, config: ServerConfig) -> int:
    """Serve ``config`` on ``serve``'s address and TLS options (bench/serve.py runs variants of it this way)."""
    from app.live.reliability import bound_native_memory

    try:
        check_exposure(args.host, config, args.no_auth, "serve")
        tls = _tls(args)
    except UsageError as exc:
        print(f"synchrony serve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from app.live.server import serve

    sock = _listen(args, "serve")
    if sock is None:
        return EXIT_BAD_INPUT
    bound_native_memory()  # before models load and codec threads start
    if config.asr_processes and Stage.ASR in config.stages:
        from app.live.asr_prestart import start_lanes

        start_lanes(config.asr_lanes, config.whisper_path)  # they load Whisper while the server imports
    serve(sock, config, tls)
    return EXIT_OK


def _cluster(args: argparse.Namespace) -> int:
    from app.cluster.ingress import NoRayCluster, serve_cluster
    from app.cluster.registry import RegistryConfig

    if not 0 <= args.local_nodes <= 8 or args.node_cpus < 1:
        print("synchrony cluster: --local-nodes must be 0..8 and --node-cpus at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        server = server_config(args, ui=False)
        check_exposure(args.host, server, args.no_auth, "cluster")
        tls = _tls(args)
    except UsageError as exc:
        print(f"synchrony cluster: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = RegistryConfig(server=server, node_host=args.node_host)
    sock = _listen(args, "cluster")
    if sock is None:
        return EXIT_BAD_INPUT
    try:
        serve_cluster(sock, config, ray_address=args.ray_address, local_nodes=args.local_nodes,
                      node_cpus=args.node_cpus, pin_nodes=args.pin_nodes, tls=tls)
    except NoRayCluster as exc:
        print(f"synchrony cluster: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _loadtest(argv: list[str]) -> int:
    from app.loadtest.cli import main as loadtest_main

    return loadtest_main(argv)


def _probe(argv: list[str]) -> int:
    from app.loadtest.probe import main as probe_main

    return probe_main(argv)


def _certify(argv: list[str]) -> int:
    from app.loadtest.certify import main as certify_main

    return certify_main(argv)


def _verify(argv: list[str]) -> int:
    from app.loadtest.certify import verify_main

    return verify_main(argv)


def _train_controller(args: argparse.Namespace) -> int:
    from models.controller_training import train_controller_command

    try:
        figures = train_controller_command(Path(args.data), Path(args.out), epochs=args.epochs, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"synchrony train-controller: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for key, value in figures.items():
        print(f"{key}: {value}")
    return EXIT_OK


def _add_server_options(p: argparse.ArgumentParser, per_node: bool = False) -> None:
    """The options of one server: ``serve``'s own, and each node's under ``cluster``."""
    p.add_argument("--max-sessions", type=int, default=_PRODUCT.max_sessions,
                   help="sessions per node (a node that reports a measured capacity uses that)" if per_node
                   else None)
    p.add_argument("--video-backend", choices=["overlay", "svd"], default=_PRODUCT.video_backend)
    p.add_argument("--svd-model", default=None, help="local SVD pipeline directory (or cached hub id)")
    p.add_argument("--responder", choices=["assistant", "caption", "openai"], default=_PRODUCT.responder,
                   help="assistant: a built-in assistant that needs no LLM; caption: echo the transcript (load tests); "
                        "openai: an OpenAI-compatible chat endpoint at --llm-url")
    p.add_argument("--llm-url", default=None, help="OpenAI-compatible endpoint for --responder openai")
    p.add_argument("--whisper", default=None, help="Whisper checkpoint (.pt) or CTranslate2 directory")
    p.add_argument("--tts", choices=["festival", "openai", "off"], default=_PRODUCT.tts,
                   help="speak the answers (and send the avatar to clients that offer a second video m-line): "
                        "festival (local, default), openai (an OpenAI-compatible /audio/speech at --tts-url), off")
    p.add_argument("--tts-url", default=None, help="OpenAI-compatible TTS base URL for --tts openai (…/v1)")
    p.add_argument("--tts-voice", default=None, help="the answer's voice (festival: slt_hts; openai: alloy)")
    p.add_argument("--auth-token", default=None, help="require this bearer token on /whip (or $SYNCHRONY_TOKEN); "
                   "required off loopback")
    p.add_argument("--no-auth", action="store_true",
                   help="serve on a non-loopback address without a token (a warning is printed)")
    p.add_argument("--protect-metrics", action="store_true",
                   help="/metrics and /metrics/lst ask for the bearer token too")
    p.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve HTTPS (the page, WHIP, metrics)")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN/TURN server for the server's ICE agent, announced to clients in WHIP Link headers "
                   "(repeatable): stun:host:3478, turn:user:pass@host:3478?transport=udp, turns:host:5349 "
                   "(TURN without user:pass@ gets short-lived credentials from --turn-secret)")
    p.add_argument("--turn-secret", default=None,
                   help="coturn's static-auth-secret (use-auth-secret), or $SYNCHRONY_TURN_SECRET: short-lived TURN "
                   "credentials per offer, so no long-lived password reaches a browser")
    p.add_argument("--turn-ttl", type=int, default=_PRODUCT.turn_ttl_s, help="seconds such TURN credentials stay valid")
    p.add_argument("--ice-relay-only", action="store_true",
                   help="the server's own ICE agent offers TURN relay candidates only (needs a turn: --ice-server)")
    p.add_argument("--forwarded-allow-ip", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy (address or CIDR, '*' any) whose X-Forwarded-For/-Proto/-Host/-Prefix "
                   "are believed (repeatable)")
    p.add_argument("--offer-rate", type=float, default=_PRODUCT.offer_rate_per_s,
                   help="WHIP offers per second per client address, past --offer-burst (0: no limit); over it 429")
    p.add_argument("--offer-burst", type=int, default=_PRODUCT.offer_burst, help="offers one address may make at once")
    p.add_argument("--allowed-origin", action="append", default=[],
                   help="a browser Origin allowed on /whip besides the page's own (repeatable)")
    p.add_argument("--output-delay", type=float, default=_PRODUCT.output_delay_s,
                   help="seconds the returned video runs behind the camera, so captions land on their frames")
    p.add_argument("--asr-lanes", type=int, default=_PRODUCT.asr_lanes,
                   help="parallel Whisper decode threads shared by all sessions (one model copy each)")
    p.add_argument("--media-timeout", type=float, default=_PRODUCT.media_timeout_s,
                   help="end a session after this many seconds without media from its peer")
    p.add_argument("--admission", choices=["measured", "fixed"], default=_PRODUCT.admission,
                   help="measured: admit sessions while the measured CPU per session leaves room on the usable "
                   "cores (capped by --max-sessions); fixed: admit --max-sessions")
    p.add_argument("--shed", type=int, choices=range(4), default=_PRODUCT.shed_steps, metavar="{0..3}",
                   help="always take the first N steps of the degradation order (AU rate 16 -> 8/s, returned "
                        "video at half size, ASR step 0.15 -> 0.3 s): less CPU per session, so more sessions per "
                        "machine (BENCHMARKS.md, issue 20)")
    p.add_argument("--session-cost", type=float, default=0.0, help="CPU per session (cores) to assume until "
                   "one has been measured (default: the figure measured on a 2-core machine)")
    p.add_argument("--turn-end-silence", type=float, default=_PRODUCT.turn_end_s,
                   help="seconds of silence that end the user's turn and release the answer (0: wait for the "
                        "ASR's endpoint and final decode, the old behaviour)")
    p.add_argument("--turn-unfinished-silence", type=float, default=_PRODUCT.turn_unfinished_end_s,
                   help="... when the last word heard rarely ends a sentence (to, the, and, ...)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="synchrony", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="run the whole pipeline on a recorded audio+video file")
    p.add_argument("input", help="media file (any container/codec FFmpeg reads)")
    p.add_argument("--out", default="out", help="output directory (report.json, annotated.mp4)")
    p.add_argument("--whisper", default=None, help="Whisper checkpoint (.pt) or CTranslate2 directory")
    p.add_argument("--no-video", action="store_true", help="skip writing annotated.mp4")
    p.add_argument("--record-au", action="store_true", help="also write au_session.csv (train-controller format)")
    p.add_argument("--video-backend", choices=["overlay", "svd"], default="overlay",
                   help="output frames: overlay on the camera (default) or Stable Video Diffusion")
    p.add_argument("--svd-model", default=None, help="local SVD pipeline directory (or cached hub id)")
    p.set_defaults(func=_analyze)

    p = sub.add_parser("serve", help="live WebRTC server (WHIP) with the browser demo at /")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    _add_server_options(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("cluster", help="one WHIP ingress placing sessions on the nodes of a Ray cluster "
                       "(docs/SCALING.md)")
    p.add_argument("--host", default="127.0.0.1", help="address of the ingress (signaling only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ray-address", default="auto",
                   help="Ray cluster to join (default: the one running on this machine)")
    p.add_argument("--local-nodes", type=int, default=0,
                   help="instead, start a Ray cluster of this many nodes on this machine (tests, demos)")
    p.add_argument("--node-cpus", type=int, default=1, help="CPUs each --local-nodes node declares to Ray")
    p.add_argument("--pin-nodes", action="store_true",
                   help="run each --local-nodes node on --node-cpus cores of its own, as separate machines")
    p.add_argument("--node-host", default=None,
                   help="address every node's server binds and offers ICE candidates on (default: the "
                   "node's $SYNCHRONY_NODE_HOST, else its Ray address)")
    _add_server_options(p, per_node=True)
    p.set_defaults(func=_cluster)

    sub.add_parser("loadtest", help="simulated WebRTC peers against a server (see `synchrony loadtest -h`)",
                   add_help=False)

    sub.add_parser("probe", help="read a server's /metrics/lst and fail below a tier (see `synchrony probe -h`)",
                   add_help=False)

    sub.add_parser("certify", help="run the LST workload against a server; write a signed report "
                   "(see `synchrony certify -h`)", add_help=False)
    sub.add_parser("verify", help="check a certify report's samples, verdict and signature", add_help=False)

    p = sub.add_parser("train-controller", help="retrain the load controller on labelled AU sessions")
    p.add_argument("--data", required=True,
                   help="CSV of labelled AU sessions (format: assets/CONTROLLER_MODEL_CARD.md)")
    p.add_argument("--out", default="controller.pt", help="where to write the new weights")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_train_controller)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["loadtest"]:
        return _loadtest(argv[1:])
    passthrough = {"probe": _probe, "certify": _certify, "verify": _verify}
    if argv[:1] and argv[0] in passthrough:
        return passthrough[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return EXIT_ERROR
    except Exception as exc:  # the last line of defence: one line for the user, the trace in the log
        log.debug("unhandled error", exc_info=True)
        print(f"synchrony {args.command}: internal error: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
