// synchrony page client: camera + microphone -> WHIP (/whip) -> returned video + `events` DataChannel.
// Wire contract: docs/WIRE.md. No framework: the Gradio page renders the markup, this script drives it.
(() => {
  "use strict";
  const AU_NAMES = ["AU1", "AU2", "AU4", "AU6", "AU7", "AU9", "AU12", "AU15", "AU17", "AU20", "AU25", "AU26"];
  const LOAD_NAMES = ["low", "moderate", "high", "overload"];
  const $ = (id) => document.getElementById(id);
  let pc = null, local = null, resource = null, words = new Map(), syncPass = 0, syncTotal = 0;

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
      local = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false },
        video: { width: 640, height: 360, frameRate: 25 },
      });
      $("sy-local").srcObject = local;
      pc = new RTCPeerConnection(config);
      const channel = pc.createDataChannel("events");
      channel.onmessage = (e) => { try { handle(JSON.parse(e.data)); } catch (err) { console.warn(err); } };
      for (const track of local.getTracks()) pc.addTransceiver(track, { direction: "sendrecv", streams: [local] });
      pc.ontrack = (ev) => {
        if (ev.track.kind !== "video") return;
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

  async function stop(del = true) {
    if (del && resource) {
      try { await fetch(resource, { method: "DELETE", headers: headers() }); } catch (e) { /* gone already */ }
    }
    resource = null;
    if (pc) { pc.close(); pc = null; }
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
    window.synchrony = { start, stop, handle, words, pc: () => pc };
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
