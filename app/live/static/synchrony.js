// synchrony page client: camera + microphone -> WHIP (/whip) -> returned video, the spoken answer
// (audio + avatar, one MediaStream) and the `events` DataChannel.
// Wire contract: docs/WIRE.md (version 2). No framework: the Gradio page renders the markup, this script drives it.
(() => {
  "use strict";
  const AU_NAMES = ["AU1", "AU2", "AU4", "AU6", "AU7", "AU9", "AU12", "AU15", "AU17", "AU20", "AU25", "AU26"];
  const LOAD_NAMES = ["low", "moderate", "high", "overload"];
  const $ = (id) => document.getElementById(id);
  let pc = null, local = null, resource = null, words = new Map(), syncPass = 0, syncTotal = 0;
  // The spoken answer: the avatar's recvonly transceiver, the answer's audio receiver, the answer on screen.
  let avatarTx = null, answerRx = null, answerStream = null, answer = null, karaokeTimer = null;
  let jitterDelay = 0.06, lastStats = 0;
  const warnings = [];

  function status(text, cls) {
    const el = $("sy-status");
    if (el) { el.textContent = text; el.className = "sy-status " + (cls || ""); }
  }

  function buildAUs() {
    const box = $("sy-aus");
    if (!box || box.childElementCount) return;
    for (const name of AU_NAMES) {
      const row = document.createElement("div");
      row.className = "sy-au";
      row.innerHTML = `<span class="sy-au-name">${name}</span><span class="sy-au-track"><span class="sy-au-fill" id="sy-au-${name}"></span></span><span class="sy-au-val" id="sy-auv-${name}" data-value="0">0.00</span>`;
      box.appendChild(row);
    }
  }

  function waitIce(conn, ms) {
    if (conn.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { if (conn.iceGatheringState === "complete") resolve(); };
      conn.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, ms);
    });
  }

  function headers() {
    const h = { "Content-Type": "application/sdp" };
    const tok = $("sy-token");
    if (tok && tok.value) h["Authorization"] = "Bearer " + tok.value;
    return h;
  }

  // Browsers give the camera only to secure contexts: HTTPS pages, or localhost.
  function insecureReason() {
    if (window.isSecureContext && navigator.mediaDevices && navigator.mediaDevices.getUserMedia) return null;
    return `Camera and microphone are unavailable: this page was loaded over plain HTTP from ${location.host}, ` +
      "and browsers allow them only on HTTPS pages or on localhost. Open it over HTTPS " +
      "(synchrony serve --tls-cert/--tls-key, or an HTTPS proxy: docs/DEPLOY.md).";
  }

  // RFC 9725 section 4.6: the server names its STUN/TURN servers in Link headers (rel="ice-server").
  function parseLinks(header) {
    const servers = [];
    for (const part of (header || "").split(/,\s*(?=<)/)) {
      const m = part.match(/^\s*<([^>]+)>(.*)$/);
      if (!m) continue;
      const p = {};
      for (const a of m[2].matchAll(/;\s*([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;,\s]+))/g)) {
        p[a[1].toLowerCase()] = a[2] !== undefined ? a[2].replace(/\\(.)/g, "$1") : a[3];
      }
      if (p.rel !== "ice-server") continue;
      const server = { urls: m[1] };
      if (p.username !== undefined) { server.username = p.username; server.credential = p.credential || ""; }
      servers.push(server);
    }
    return servers;
  }

  async function iceConfig() {
    const resp = await fetch("/whip", { method: "OPTIONS", headers: headers() });
    if (resp.status === 401) throw new Error("the server refused the access token");
    const config = { iceServers: resp.ok ? parseLinks(resp.headers.get("Link")) : [] };
    if (new URLSearchParams(location.search).get("ice") === "relay") config.iceTransportPolicy = "relay";
    return config;
  }

  async function start() {
    buildAUs();
    const insecure = insecureReason();
    if (insecure) { status(insecure, "sy-bad"); return; }
    const app = $("sy-app"), tok = $("sy-token");
    if (app && app.dataset.auth === "1" && tok && !tok.value) {
      status("this server needs an access token: enter it, then start", "sy-bad");
      tok.focus();
      return;
    }
    $("sy-start").disabled = true;
    status("opening camera…");
    try {
      const config = await iceConfig();
      local = await navigator.mediaDevices.getUserMedia({ audio: micConstraints(), video: { width: 640, height: 360, frameRate: 25 } });
      $("sy-local").srcObject = local;
      pc = new RTCPeerConnection(config);
      const channel = pc.createDataChannel("events");
      channel.onmessage = (e) => { try { handle(JSON.parse(e.data)); } catch (err) { console.warn(err); } };
      for (const track of local.getTracks()) pc.addTransceiver(track, { direction: "sendrecv", streams: [local] });
      // Wire v2: a second video m-line, receive only, for the avatar of the spoken answer.
      avatarTx = pc.addTransceiver("video", { direction: "recvonly" });
      pc.ontrack = (ev) => {
        if (ev.track.kind === "audio" || ev.transceiver === avatarTx) { playAnswer(ev); return; }
        const v = $("sy-remote");
        v.srcObject = new MediaStream([ev.track]);
        v.play().catch(() => {});
      };
      pc.onconnectionstatechange = () => {
        const s = pc ? pc.connectionState : "closed";
        if (s === "connected") status("live", "sy-live");
        else if (s === "failed" || s === "closed") status("connection " + s, "sy-bad");
      };
      await pc.setLocalDescription(await pc.createOffer());
      await waitIce(pc, 2000);
      status("connecting…");
      const resp = await fetch("/whip", { method: "POST", headers: headers(), body: pc.localDescription.sdp });
      if (resp.status !== 201) {
        const why = resp.status === 401 ? "the access token was refused" : (await resp.text()).trim();
        throw new Error(`server said ${resp.status}: ${why}`);
      }
      resource = resp.headers.get("Location");
      await pc.setRemoteDescription({ type: "answer", sdp: await resp.text() });
      $("sy-stop").disabled = false;
    } catch (err) {
      status(String(err.message || err), "sy-bad");
      await stop(false);
      $("sy-start").disabled = false;
    }
  }

  // Echo cancellation stays on for the whole session when answers are spoken: the answer plays from
  // this page's speaker, and Chrome cannot turn the canceller on for a track that is already open.
  // Noise suppression and automatic gain stay off: the server's voice activity, word onsets and turn
  // ends are measured on unprocessed audio, and both reshape speech onsets (gain ramping up at the first
  // syllable, suppression eating soft word starts) without helping the canceller.
  function micConstraints() {
    const app = $("sy-app");
    const spoken = !app || app.dataset.answers !== "0";
    return { echoCancellation: spoken, noiseSuppression: false, autoGainControl: false };
  }

  // The answer's audio and avatar share one stream id (msid), so the browser lip-syncs them; they play
  // together, not muted, in their own element beside the returned camera.
  function playAnswer(ev) {
    if (ev.track.kind === "audio") answerRx = ev.receiver;
    const el = $("sy-answer");
    const stream = ev.streams && ev.streams[0];
    if (stream) answerStream = stream;
    else { answerStream = answerStream || new MediaStream(); answerStream.addTrack(ev.track); }
    if (el.srcObject !== answerStream) el.srcObject = answerStream;
    el.muted = false;
    el.play().catch((err) => console.warn("answer playback:", err));
    if (ev.track.kind === "video") $("sy-answer-fig").classList.remove("sy-audio-only");
  }

  // --- karaoke: the spoken words lit as the element plays them ---------------------------------------
  const RTP_RATE = 48000;
  const rtpDiff = (a, b) => { let d = (a - b) >>> 0; return d >= 0x80000000 ? d - 0x100000000 : d; };

  // The RTP timestamp of the answer audio the element is playing now: the receiver's last played packet
  // (getSynchronizationSources) plus the time since. null where the browser does not say.
  function playingRtp() {
    if (!answerRx || !answerRx.getSynchronizationSources) return null;
    const src = answerRx.getSynchronizationSources()[0];
    if (!src || typeof src.rtpTimestamp !== "number") return null;
    const now = performance.timeOrigin + performance.now();
    const since = Math.min(Math.max(now - src.timestamp, 0), 100);
    return (src.rtpTimestamp + Math.round(since * RTP_RATE / 1000)) >>> 0;
  }

  // Otherwise: the session time playing now, from the answer's start as it arrived plus the receiver's
  // jitter-buffer delay (getStats), refreshed once a second.
  function playingSessionTime() {
    if (!answer) return null;
    const now = performance.now();
    if (answerRx && now - lastStats > 1000) {
      lastStats = now;
      answerRx.getStats().then((stats) => stats.forEach((s) => {
        if (s.type === "inbound-rtp" && s.jitterBufferEmittedCount > 0)
          jitterDelay = s.jitterBufferDelay / s.jitterBufferEmittedCount;
      })).catch(() => {});
    }
    return answer.pts + (now - answer.arrived) / 1000 - jitterDelay;
  }

  function karaoke() {
    if (!answer) return;
    const rtp = playingRtp();
    const t = rtp === null ? playingSessionTime() : null;
    // Which clock timed the words (the test reads it): the receiver's played RTP, or the session-time estimate.
    $("sy-answer-text").dataset.clock = rtp !== null && answer.words.some((w) => w.rtp !== null) ? "rtp" : "session";
    let current = -1;
    for (const w of answer.words) {
      const started = rtp !== null && w.rtp !== null ? rtpDiff(rtp, w.rtp) >= 0 : t !== null && t >= w.start;
      if (!started) break;
      current = w.index;
      const ended = rtp !== null && w.rtp !== null ? rtpDiff(rtp, (w.rtp + Math.round((w.end - w.start) * RTP_RATE)) >>> 0) >= 0
        : t !== null && t >= w.end;
      w.span.classList.add("sy-spoken");
      w.span.classList.toggle("sy-speaking", !ended);
    }
    answer.current = current;
  }

  function answerStart(m) {
    const box = $("sy-answer-text");
    box.textContent = "";
    answer = { key: m.answer, pts: Number(m.pts) || 0, arrived: performance.now(), words: [], current: -1 };
    $("sy-answer-state").textContent = `answering · server voice latency ${fmt(m.voice_latency_ms, 0)} ms`;
    $("sy-answer-state").className = "sy-note sy-speaking-now";
    if (!karaokeTimer) karaokeTimer = setInterval(karaoke, 20);
  }

  function answerWord(m) {
    if (!answer || m.answer !== answer.key) return;
    const span = document.createElement("span");
    span.className = "sy-aword";
    span.textContent = m.text;
    span.dataset.index = m.index;
    span.dataset.start = m.start;
    const box = $("sy-answer-text");
    if (box.childElementCount) box.appendChild(document.createTextNode(" "));
    box.appendChild(span);
    const rtp = typeof m.rtp_start === "number" ? (m.rtp_start >>> 0) : null;
    answer.words.push({ index: m.index, start: Number(m.start), end: Number(m.end), rtp, span });
  }

  const REASONS = { done: "finished", barge_in: "you interrupted", max_tokens: "length limit for this load",
                    error: "stopped by an error" };

  function responseEnd(m) {
    const el = $("sy-answer-state");
    const reason = REASONS[m.reason] || m.reason;
    el.textContent = `answer ended: ${m.reason} (${reason}) · ${m.words} word${m.words === 1 ? "" : "s"} spoken`
      + (m.last_word ? ` · last “${m.last_word}”` : "");
    el.className = "sy-note sy-end-" + m.reason;
    el.dataset.reason = m.reason;
    if (answer && m.answer === answer.key) {
      for (const w of answer.words) if (w.index >= m.words) w.span.classList.add("sy-unspoken");
    }
  }

  function warning(m) {
    warnings.push(m);
    const box = $("sy-warnings");
    const row = document.createElement("div");
    row.className = "sy-warning";
    row.textContent = `${m.stage}: ${m.message}`;
    box.appendChild(row);
    while (box.childElementCount > 4) box.removeChild(box.firstChild);
  }

  async function stop(del = true) {
    if (del && resource) {
      try { await fetch(resource, { method: "DELETE", headers: headers() }); } catch (e) { /* gone already */ }
    }
    resource = null;
    if (pc) { pc.close(); pc = null; }
    if (karaokeTimer) { clearInterval(karaokeTimer); karaokeTimer = null; }
    avatarTx = answerRx = answerStream = null;
    if (local) { for (const t of local.getTracks()) t.stop(); local = null; }
    $("sy-stop").disabled = true;
    $("sy-start").disabled = false;
    if (del) status("stopped");
  }

  function fmt(x, digits = 2) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }

  function renderTranscript() {
    const box = $("sy-transcript");
    const list = [...words.values()].sort((a, b) => a.utterance - b.utterance || a.start - b.start);
    box.innerHTML = "";
    let utt = null;
    for (const w of list.slice(-60)) {
      if (utt !== null && w.utterance !== utt) box.appendChild(document.createElement("br"));
      utt = w.utterance;
      const span = document.createElement("span");
      span.className = "sy-word" + (w.final ? " sy-final" : " sy-interim") + (w.late ? " sy-late" : "");
      span.dataset.start = w.start;
      span.dataset.text = w.text;
      span.innerHTML = `${escapeHtml(w.text)}<sub>${fmt(w.start)}–${fmt(w.end)}</sub>`;
      span.title = `frames ${w.frames.join(", ")}${w.late ? " (late)" : ""}`;
      box.appendChild(span);
    }
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function handle(m) {
    switch (m.type) {
      case "hello": {
        status(`live · session ${m.session} · wire v${m.version}`, "sy-live");
        const missing = m.missing || {};
        const note = (id, stage, what) => {
          if (!(stage in missing)) return;
          const el = $(id);
          el.textContent = `${what} unavailable on this server`;
          el.title = missing[stage];
          el.classList.add("sy-missing");
        };
        note("sy-policy", "controller", "load controller");
        note("sy-response", "response", "responder");
        note("sy-sync-note", "sync", "Level-3 validator");
        const a = m.answer || {};
        $("sy-answer-voice").textContent = !a.audio ? "answers as text only"
          : `voice ${a.voice || "?"}${a.video ? " · avatar" : " · no avatar"}`;
        break;
      }
      case "token": {
        const key = `${m.utterance}:${m.index}`;
        words.set(key, m);
        renderTranscript();
        break;
      }
      case "au":
        buildAUs();
        $("sy-face").textContent = m.face ? `face at t=${fmt(m.pts)} s` : "no face in view";
        for (const name of AU_NAMES) {
          const v = m.au[name] || 0;
          const fill = $("sy-au-" + name), val = $("sy-auv-" + name);
          if (fill) fill.style.width = `${Math.round(v * 100)}%`;
          if (val) { val.textContent = v.toFixed(2); val.dataset.value = v; }
        }
        break;
      case "load":
        $("sy-load").textContent = `${m.level} · ${LOAD_NAMES[m.level] || "?"}`;
        $("sy-load").className = "sy-load-" + m.level;
        $("sy-policy").textContent = `${fmt(m.policy.tokens_per_s, 1)} tokens/s · max ${m.policy.max_tokens} · T ${fmt(m.policy.temperature)}`;
        break;
      case "sync": {
        syncTotal += 1; syncPass += m.ok ? 1 : 0;
        const el = $("sy-sync");
        el.className = "sy-badge " + (m.ok ? "sy-ok" : "sy-fail");
        el.textContent = `${m.ok ? "in sync" : "out of sync"} · ${fmt(m.max_delta_ms, 0)} ms`;
        $("sy-sync-note").textContent = `“${m.token}”: audio ${fmt(m.audio)} · video ${fmt(m.video)} · text ${fmt(m.text)} s (${m.evidence}) — ${syncPass}/${syncTotal} passed`;
        break;
      }
      case "response": {
        const box = $("sy-response");
        if (m.index === 0) box.textContent = "";
        box.textContent += (box.textContent ? " " : "") + m.text;
        break;
      }
      case "lst":
        $("sy-ttft").textContent = m.ttft_ms_p99 === null ? "–" : `${fmt(m.ttft_ms_p99, 0)} ms`;
        $("sy-itl").textContent = m.itl_ms_max === null ? "–" : `${fmt(m.itl_ms_max, 0)} ms`;
        $("sy-jitter").textContent = m.jitter_ms === null ? "–" : `${fmt(m.jitter_ms, 1)} ms`;
        $("sy-tier").textContent = m.tier || "none";
        break;
      case "error":
        status(`${m.stage} degraded: ${m.message}`, "sy-bad");
        break;
      case "answer_start": answerStart(m); break;
      case "answer_word": answerWord(m); break;
      case "response_end": responseEnd(m); break;
      case "warning": warning(m); break;
      default:
        break;
    }
  }

  function bind() {
    const startBtn = $("sy-start");
    if (!startBtn || startBtn.dataset.bound) return false;
    startBtn.dataset.bound = "1";
    startBtn.addEventListener("click", start);
    $("sy-stop").addEventListener("click", () => stop(true));
    const app = $("sy-app");
    if (app && app.dataset.auth !== "1") $("sy-token-form").style.display = "none";
    buildAUs();
    const insecure = insecureReason();
    if (insecure) { status(insecure, "sy-bad"); startBtn.title = insecure; }
    window.synchrony = { start, stop, handle, words, warnings, micConstraints,
                         answer: () => answer, local: () => local, pc: () => pc };
    return true;
  }

  // A dark page to match the panel (Gradio's own dark theme is the body class "dark").
  const darken = () => document.body && document.body.classList.add("dark");
  if (document.body) darken(); else document.addEventListener("DOMContentLoaded", darken);
  // Gradio renders the panel after the page loads: bind once it exists.
  if (!bind()) {
    const obs = new MutationObserver(() => { if (bind()) obs.disconnect(); });
    obs.observe(document.documentElement, { childList: true, subtree: true });
  }
  window.addEventListener("beforeunload", () => { if (resource) navigator.sendBeacon && stop(true); });
})();
