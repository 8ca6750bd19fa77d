// The demo page's client: one OpenAI Realtime session, over WebRTC where the browser has
// it (RTCPeerConnection), else over the /v1/realtime websocket (?transport=websocket
// forces it). Either way the page holds no API key past the connect: the key typed in
// buys an ephemeral one from /v1/realtime/client_secrets, and the session opens with that.
//
// WebRTC (POST /v1/realtime/calls, as OpenAI's browser path): the microphone is the
// call's audio track, the reply plays from the server's track in an <audio> element, and
// the events travel on the "oai-events" data channel. The server knows what it played,
// so a barge-in or Stop cuts the reply where it was heard with no truncate from here.
//
// Websocket: microphone -> capture worklet (24 kHz PCM16, 20 ms frames) ->
// input_audio_buffer.append; the server's VAD ends each turn and answers;
// response.output_audio.delta is played gaplessly by scheduling one AudioBufferSourceNode
// per delta back to back on the AudioContext's timeline. Speech during a reply (barge-in)
// or the Stop button flushes what is scheduled at once and truncates the reply to what
// was heard. window.omniDemo mirrors what the page shows, for tests.

const RATE = 24000; // PCM16 mono, both ways (session.update below asks for it)
const LEAD_S = 0.05; // first delta of a burst starts this far ahead: room for jitter

const SESSION = {
  type: "realtime",
  output_modalities: ["audio"],
  audio: {
    input: {
      format: { type: "audio/pcm", rate: RATE },
      turn_detection: {
        type: "server_vad",
        threshold: 0.5,
        prefix_padding_ms: 300,
        silence_duration_ms: 500,
        create_response: true,
        interrupt_response: true,
      },
    },
    output: { format: { type: "audio/pcm", rate: RATE }, voice: "chelsie" },
  },
};

// What the page shows, kept as plain data so a test can poll JSON.stringify(omniDemo).
const demo = {
  state: "disconnected", // disconnected | connecting | connected | ready | closed
  turns: [], // {responseId, itemId, ttfaMs, audioDeltas, samplesReceived, samplesPlayed, heardMs, truncatedMs, status}
  audioDeltasPlayed: 0, // deltas whose audio reached the output (fully or until a flush)
  samplesScheduled: 0,
  transcript: [], // {responseId, text}
  errors: [], // error.message of each `error` event, and connection failures
  notice: "", // why the page cannot work here (no microphone outside a secure context)
  transport: null, // "webrtc" | "websocket", once connecting
  ephemeralKey: false, // the session opened with a key from /v1/realtime/client_secrets
  rtc: null, // WebRTC: the reply track's inbound-rtp stats {packetsReceived, totalAudioEnergy, ...}
};
window.omniDemo = demo;

const $ = (id) => document.getElementById(id);

let ws = null;
let call = null; // WebRTC: {pc, channel, player, statsTimer}
let audio = null; // {context, stream, worklet}
let speechStoppedAt = null; // performance.now() of the last speech_stopped
let inFlight = null; // the turn whose response.done has not come yet
const turnStart = new Map(); // responseId -> performance.now() its TTFA counts from
const dropped = new Set(); // responses flushed here: their late deltas are not played

// ---- playback ------------------------------------------------------------------------

let playhead = 0; // context time where the next delta starts
const scheduled = new Set(); // {source, start, samples, turn}

function play(turn, base64) {
  const samples = decodePcm16(base64);
  if (samples.length === 0) return;
  const context = audio.context;
  const buffer = context.createBuffer(1, samples.length, RATE);
  buffer.copyToChannel(samples, 0);
  const source = context.createBufferSource();
  source.buffer = buffer;
  source.connect(context.destination);
  // Back to back: a delta starts where the previous one ends, unless playback ran dry.
  playhead = Math.max(playhead, context.currentTime + LEAD_S);
  const entry = { source, start: playhead, samples: samples.length, turn };
  source.onended = () => finished(entry, samples.length);
  source.start(playhead);
  playhead += buffer.duration;
  scheduled.add(entry);
  demo.samplesScheduled += samples.length;
  turn.samplesReceived += samples.length;
}

function finished(entry, played) {
  if (!scheduled.delete(entry)) return;
  if (played > 0) {
    demo.audioDeltasPlayed += 1;
    entry.turn.samplesPlayed += played;
  }
}

// Stop everything scheduled now; a delta cut midway counts what was heard of it.
// Returns the turns whose audio was cut short.
function flushPlayback() {
  const cut = new Set();
  if (!audio || !audio.context) return cut; // a call: the server stops its own track
  const now = audio.context.currentTime;
  for (const entry of [...scheduled]) {
    entry.source.onended = null;
    entry.source.stop();
    const heard = Math.max(0, Math.min(entry.samples, Math.round((now - entry.start) * RATE)));
    finished(entry, heard);
    if (heard < entry.samples) cut.add(entry.turn);
  }
  playhead = 0;
  return cut;
}

// Barge-in or Stop: the server cannot know how much of the reply the user heard, so the
// page tells it (conversation.item.truncate), and the conversation keeps only that. An
// item can be truncated once its response is done: until then the truncate waits.
function cutPlayback() {
  for (const turn of flushPlayback()) {
    turn.heardMs = Math.floor((turn.samplesPlayed * 1000) / RATE);
    if (turn.status !== "in_progress") truncate(turn);
  }
}

function truncate(turn) {
  send({ type: "conversation.item.truncate", item_id: turn.itemId, content_index: 0, audio_end_ms: turn.heardMs });
}

function decodePcm16(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(bytes.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
}

function encodeBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i++) text += String.fromCharCode(bytes[i]);
  return btoa(text);
}

// ---- microphone ----------------------------------------------------------------------

// A browser offers the microphone (navigator.mediaDevices) only to a secure context:
// https, or http://localhost / 127.0.0.1. Over plain http from another machine it is
// undefined, and the page says why instead of failing on getUserMedia.
const NO_MICROPHONE =
  "the microphone needs https or localhost: this page was opened over plain http from " +
  "another machine. Serve with --ssl-certfile/--ssl-keyfile, put a TLS proxy in front, " +
  "or open an SSH tunnel (ssh -L 8000:localhost:8000 HOST) and browse http://localhost:8000/";

function microphoneAvailable() {
  return Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);
}

async function startAudio(viaWebRTC) {
  if (!microphoneAvailable()) throw new Error(NO_MICROPHONE);
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: true, noiseSuppression: true, channelCount: 1 },
  });
  if (viaWebRTC) {
    audio = { context: null, stream, worklet: null }; // the call carries it: no worklet
    return;
  }
  const context = new AudioContext();
  await context.audioWorklet.addModule("/static/capture-worklet.js");
  const worklet = new AudioWorkletNode(context, "capture-worklet");
  worklet.port.onmessage = (message) => {
    if (demo.state === "ready") send({ type: "input_audio_buffer.append", audio: encodeBase64(message.data) });
  };
  context.createMediaStreamSource(stream).connect(worklet);
  await context.resume();
  audio = { context, stream, worklet };
}

function stopAudio() {
  if (!audio) return;
  flushPlayback();
  for (const track of audio.stream.getTracks()) track.stop();
  if (audio.worklet) audio.worklet.port.onmessage = null;
  if (audio.context) audio.context.close();
  audio = null;
}

// ---- the session ---------------------------------------------------------------------

function send(event) {
  if (call && call.channel.readyState === "open") call.channel.send(JSON.stringify(event));
  else if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

function webrtcAvailable() {
  const asked = new URLSearchParams(location.search).get("transport");
  return asked !== "websocket" && typeof RTCPeerConnection === "function";
}

// The key typed in (the server's, or none when it needs none) buys an ephemeral key bound
// to the session's config; only that one opens the session.
async function ephemeralKey() {
  const key = $("api-key").value.trim();
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  const reply = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers,
    body: JSON.stringify({ session: SESSION }),
  });
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error?.message ?? `HTTP ${reply.status}`);
  demo.ephemeralKey = true;
  return body.value;
}

async function connect() {
  setState("connecting");
  const viaWebRTC = webrtcAvailable();
  demo.transport = viaWebRTC ? "webrtc" : "websocket";
  try {
    await startAudio(viaWebRTC);
  } catch (err) {
    showError(`microphone: ${err.message}`);
    setState("disconnected");
    return;
  }
  let key;
  try {
    key = await ephemeralKey();
  } catch (err) {
    showError(`no session key: ${err.message} (is the API key right?)`);
    stopAudio();
    setState("disconnected");
    return;
  }
  if (viaWebRTC) {
    try {
      await startCall(key);
    } catch (err) {
      showError(`call failed: ${err.message}`);
      hangUp();
    }
    return;
  }
  const protocols = ["realtime", `openai-insecure-api-key.${key}`];
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  try {
    ws = new WebSocket(`${scheme}://${location.host}/v1/realtime`, protocols);
  } catch (err) {
    showError(`cannot connect: ${err.message} (an API key is letters, digits and -_.)`);
    stopAudio();
    setState("disconnected");
    return;
  }
  ws.onopen = () => send({ type: "session.update", session: SESSION });
  ws.onmessage = (message) => onEvent(JSON.parse(message.data));
  ws.onerror = () => showError("websocket error (is the server up? is the API key right?)");
  ws.onclose = (close) => {
    if (close.code !== 1000 && close.code !== 1005) showError(`closed: ${close.code} ${close.reason}`);
    ws = null;
    stopAudio();
    setState("closed");
  };
}

// WebRTC: offer the microphone and the events' data channel, post the offer with the
// ephemeral key, take the answer. The reply plays from the server's track.
async function startCall(key) {
  const pc = new RTCPeerConnection();
  const player = document.createElement("audio");
  player.autoplay = true;
  document.body.append(player);
  call = { pc, channel: null, player, statsTimer: null };
  pc.ontrack = (event) => {
    player.srcObject = event.streams[0] ?? new MediaStream([event.track]);
  };
  for (const track of audio.stream.getAudioTracks()) pc.addTrack(track, audio.stream);
  const channel = pc.createDataChannel("oai-events");
  call.channel = channel;
  channel.onopen = () => send({ type: "session.update", session: SESSION });
  channel.onmessage = (message) => onEvent(JSON.parse(message.data));
  channel.onclose = () => hangUp();
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed") {
      showError("the call's connection failed");
      hangUp();
    }
  };
  await pc.setLocalDescription(await pc.createOffer());
  const reply = await fetch("/v1/realtime/calls", {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/sdp" },
    body: pc.localDescription.sdp,
  });
  const answer = await reply.text();
  if (reply.status !== 201) {
    let message = `HTTP ${reply.status}`;
    try {
      message = JSON.parse(answer).error.message;
    } catch {}
    throw new Error(message);
  }
  await pc.setRemoteDescription({ type: "answer", sdp: answer });
  call.statsTimer = setInterval(() => readStats(pc), 250);
}

// What arrived on the reply track, for the page's state (and the tests).
async function readStats(pc) {
  const stats = await pc.getStats();
  stats.forEach((report) => {
    if (report.type === "inbound-rtp" && report.kind === "audio") {
      demo.rtc = {
        packetsReceived: report.packetsReceived ?? 0,
        totalSamplesReceived: report.totalSamplesReceived ?? 0,
        totalAudioEnergy: report.totalAudioEnergy ?? 0,
        audioLevel: report.audioLevel ?? 0,
      };
    }
  });
}

function hangUp() {
  if (!call) return;
  const { pc, channel, player, statsTimer } = call;
  call = null;
  clearInterval(statsTimer);
  channel.onclose = null;
  channel.close();
  pc.close();
  player.srcObject = null;
  player.remove();
  stopAudio();
  setState("closed");
}

function disconnect() {
  if (call) hangUp();
  else if (ws) ws.close(1000);
  else stopAudio();
}

function stop() {
  if (inFlight) {
    send({ type: "response.cancel", event_id: `stop_${inFlight.responseId}`, response_id: inFlight.responseId });
    dropped.add(inFlight.responseId);
  }
  cutPlayback();
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
      setState("connected");
      break;
    case "session.updated":
      setState("ready");
      break;
    case "input_audio_buffer.speech_started":
      // Barge-in: the server cancels its reply; what is already here must not play on.
      if (inFlight) dropped.add(inFlight.responseId);
      cutPlayback();
      setSpeaking(true);
      break;
    case "input_audio_buffer.speech_stopped":
      speechStoppedAt = performance.now();
      setSpeaking(false);
      break;
    case "response.created":
      inFlight = {
        responseId: event.response.id,
        ttfaMs: null,
        itemId: null,
        audioDeltas: 0,
        samplesReceived: 0,
        samplesPlayed: 0,
        heardMs: null, // set when its playback was cut short
        truncatedMs: null, // the server's conversation.item.truncated
        status: "in_progress",
      };
      turnStart.set(inFlight.responseId, speechStoppedAt ?? performance.now());
      speechStoppedAt = null;
      demo.turns.push(inFlight);
      renderTurns();
      break;
    case "response.output_audio.delta": {
      const turn = demo.turns.find((t) => t.responseId === event.response_id);
      if (!turn || dropped.has(turn.responseId) || !audio) break;
      if (turn.ttfaMs === null) {
        turn.ttfaMs = Math.round(performance.now() - turnStart.get(turn.responseId));
        renderTurns();
      }
      turn.itemId = event.item_id;
      turn.audioDeltas += 1;
      play(turn, event.delta);
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const turn = demo.turns.find((t) => t.responseId === event.response_id);
      if (turn) turn.itemId = event.item_id; // a call's turn has no audio deltas
      transcriptLine(event.response_id).text += event.delta;
      renderTranscript();
      break;
    }
    case "response.output_audio_transcript.done":
      transcriptLine(event.response_id).text = event.transcript;
      renderTranscript();
      break;
    case "response.done": {
      const turn = demo.turns.find((t) => t.responseId === event.response.id);
      if (inFlight && inFlight.responseId === event.response.id) inFlight = null;
      if (turn) {
        turn.status = event.response.status;
        if (turn.heardMs !== null) truncate(turn);
      }
      renderTurns();
      break;
    }
    case "conversation.item.truncated": {
      const turn = demo.turns.find((t) => t.itemId === event.item_id);
      if (turn) turn.truncatedMs = event.audio_end_ms;
      renderTurns();
      break;
    }
    case "error":
      // A Stop that crossed its response's end on the wire: nothing was left to cancel.
      if (event.error.code === "response_cancel_not_active" && event.error.event_id?.startsWith("stop_")) break;
      showError(event.error.message);
      break;
  }
}

// ---- the view ------------------------------------------------------------------------

function setState(state) {
  demo.state = state;
  $("state").textContent = state;
  $("connect").textContent = ["connecting", "connected", "ready"].includes(state) ? "Disconnect" : "Connect";
}

function setSpeaking(speaking) {
  $("speaking").textContent = speaking ? "speaking" : "";
}

function showError(message) {
  demo.errors.push(message);
  const item = document.createElement("li");
  item.textContent = message;
  $("errors").append(item);
}

function transcriptLine(responseId) {
  let line = demo.transcript.find((l) => l.responseId === responseId);
  if (!line) {
    line = { responseId, text: "" };
    demo.transcript.push(line);
  }
  return line;
}

function renderTranscript() {
  $("transcript").replaceChildren(
    ...demo.transcript.map((line) => {
      const p = document.createElement("p");
      p.textContent = line.text;
      return p;
    }),
  );
}

function renderTurns() {
  $("turns").replaceChildren(
    ...demo.turns.map((turn) => {
      const row = document.createElement("tr");
      const ttfa = turn.ttfaMs === null ? "-" : `${turn.ttfaMs} ms`;
      const cut = turn.truncatedMs === null ? "" : ` (heard ${turn.truncatedMs} ms)`;
      for (const cell of [turn.responseId, ttfa, turn.status + cut]) {
        const td = document.createElement("td");
        td.textContent = cell;
        row.append(td);
      }
      return row;
    }),
  );
}

$("connect").onclick = () => {
  if (ws || call) disconnect();
  else if (demo.state !== "connecting") connect(); // a second click waits for the microphone
};
$("stop").onclick = stop;
setState("disconnected");
if (!microphoneAvailable()) {
  $("notice").textContent = NO_MICROPHONE;
  demo.notice = NO_MICROPHONE;
}
