// chat.js: the chat page. The session lives in the URL (?session=<id>); on open the committed
// history is loaded and a turn still running is rejoined from its first frame (the event log
// replays it), so a reload or a second tab shows the whole conversation. Turns sent from this
// tab are streamed by their submit; every other turn is found on the session's live stream and
// followed by id. All the HTTP is stickless.js; markdown is markdown.js (escaped, no raw HTML).
import { Client, SticklessError, TERMINAL_EVENTS, randomId } from "/static/stickless.js";
import { renderMarkdown } from "/static/markdown.js";

const params = new URLSearchParams(location.search);
const AGENT_REF = params.get("agent") || "demo-agent";
const TOKEN_KEY = "stickless.token";
let sessionId = params.get("session");
if (!sessionId) {
  sessionId = "chat-" + randomId(8);
  params.set("session", sessionId);
  history.replaceState(null, "", "?" + params.toString());
}
const SENT_KEY = "stickless.sent." + sessionId;

const $ = (sel) => document.querySelector(sel);
const els = {
  session: $("#session"), newSession: $("#new-session"), log: $("#log"), form: $("#composer"),
  input: $("#input"), send: $("#send"), stop: $("#stop"), options: $("#options"),
  status: $("#status"), auth: $("#auth"), token: $("#token"), queue: $("#queue-choice"),
  priority: $("#priority"),
};
els.options.value = params.get("options") || "";
els.session.textContent = sessionId;

const views = new Map();        // turn id -> TurnView
const submitting = new Set();   // connected promises of this tab's submits not answered yet
let version = 0;                // transcript entries shown
let follower = null;            // the session's live stream
let reconnectsTotal = 0;

const client = new Client({
  token: sessionStorage.getItem(TOKEN_KEY), retries: 1e9, backoff: { first: 200, max: 3000 },
  onRetry: ({ stream }) => {
    const view = stream && stream.view;
    if (view && !view.final) {
      view.countReconnect(stream.reconnects + 1);
      view.show("reconnecting", "reconnecting\u2026");
    }
  },
});

// Inputs this tab sent, by turn id: a reload shows them (and their turns) before, or without,
// the transcript having them.
const sent = JSON.parse(sessionStorage.getItem(SENT_KEY) || "{}");
function remember(turnId, message) {
  sent[turnId] = message;
  sessionStorage.setItem(SENT_KEY, JSON.stringify(sent));
}

function setStatus(message) { els.status.textContent = message; }

function describe(error) {
  if (error instanceof SticklessError && error.status === 401) askToken();
  return error && error.message ? error.message : String(error);
}

function askToken() {
  els.auth.hidden = false;
  els.token.focus();
}

// ------------------------------------------------------------------ the view of one turn

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

class TurnView {
  constructor(message) {
    this.el = el("div", "turn");
    this.el.dataset.state = "sending";
    this.el.dataset.reconnects = "0";
    this.user = el("div", "user");
    this.setUser(message);
    const assistant = el("div", "assistant");
    this.reasoning = el("div", "reasoning");
    this.tools = el("div", "tools");
    this.text = el("div", "text");
    this.note = el("div", "note");
    assistant.append(this.reasoning, this.tools, this.text, this.note);
    const meta = el("div", "meta");
    const stateSpan = el("span", null, "");
    this.state = el("b", "state", "\u2014");
    stateSpan.append(this.state);
    const ids = el("details", "ids");
    ids.append(el("summary", null, "details"));
    const field = (label, cls) => {
      const span = el("span", null, label + " ");
      const value = el("code", cls, "\u2014");
      span.append(value);
      ids.append(span);
      return value;
    };
    this.turnIdEl = field("turn", "turn-id");
    this.accepted = field("accepted by", "accepted-by");
    this.executed = field("executed by", "executed-by");
    this.reconnects = field("reconnects", "reconnect-count");
    this.reconnects.textContent = "0";
    meta.append(stateSpan, ids);
    this.el.append(this.user, assistant, meta);
    els.log.append(this.el);
    this.raw = "";
    this.attempt = 1;
    this.final = false;
    this.gapped = false;
    this.started = false;
    this.turnId = null;
  }

  setUser(message) {
    this.user.textContent = message === null ? "(sent from another tab)" : message;
    this.user.classList.toggle("pending", message === null);
    this.hasUser = message !== null;
  }

  setTurn(turnId, acceptedBy) {
    this.turnId = turnId;
    this.el.dataset.turnId = turnId;
    this.turnIdEl.textContent = turnId;
    if (acceptedBy) this.accepted.textContent = acceptedBy;
    views.set(turnId, this);
  }

  setText(raw) {
    this.raw = raw;
    this.text.innerHTML = renderMarkdown(raw);
  }

  show(token, label) {
    this.el.dataset.state = token;
    this.state.textContent = label || token;
    refreshControls();
  }

  countReconnect(count) {
    reconnectsTotal += 1;
    document.body.dataset.reconnects = String(reconnectsTotal);
    this.el.dataset.reconnects = String(count);
    this.reconnects.textContent = String(count);
  }

  /** One item of the turn's stream (already deduplicated by event id). */
  apply(event) {
    if (event.type === "gap") {
      this.gapped = true;
      this.note.textContent = "some events were lost; the text is the turn's final answer";
      return;
    }
    if (event.attempt > this.attempt) {
      // A retry runs the agent again from the start: its reply replaces the failed one's.
      this.attempt = event.attempt;
      this.setText("");
      this.reasoning.textContent = "";
      this.tools.textContent = "";
    }
    if (event.executed_by) this.executed.textContent = event.executed_by;
    switch (event.type) {
      case "turn_started":
        this.started = true;
        this.show("running");
        break;
      case "text_delta":
        this.setText(this.raw + event.text);
        if (this.el.dataset.state !== "running") this.show("running");
        scrollDown();
        break;
      case "reasoning_delta":
        this.reasoning.textContent += event.text;
        break;
      case "tool_use_started": {
        const line = el("div", null, "\u2699 " + event.name + " \u2026");
        line.dataset.toolUseId = event.tool_use_id;
        this.tools.append(line);
        break;
      }
      case "tool_use_finished": {
        const line = Array.from(this.tools.children)
          .find((d) => d.dataset.toolUseId === event.tool_use_id);
        const done = "\u2699 " + event.name + (event.ok ? " \u2713" : " \u2717") +
          (event.output_summary ? " " + event.output_summary : "");
        if (line) line.textContent = done; else this.tools.append(el("div", null, done));
        break;
      }
      default:
        if (TERMINAL_EVENTS.includes(event.type)) this.end(event);
    }
  }

  end(event) {
    if (event.retrying) {
      this.show("retrying", `attempt ${event.attempt} ${event.type.replace("turn_", "")}, retrying`);
      return;
    }
    this.final = true;
    if (event.type === "turn_completed") {
      // After a gap, or for a message that joined another turn, the answer is the text.
      if (this.gapped || !this.started || !this.raw.trim()) this.setText(event.text);
      this.show("completed", this.started ? "completed" : "completed (joined the running turn)");
    } else if (event.type === "turn_failed") {
      this.show("failed", "failed: " + event.code);
      this.note.textContent = event.message || "";
    } else if (event.type === "interrupted") {
      this.show("interrupted", "interrupted (" + event.reason + ")");
    } else {
      this.show("rejected", "rejected: " + event.reason);
      this.note.textContent = event.message || "";
    }
  }
}

function scrollDown() { els.log.scrollTop = els.log.scrollHeight; }

function running() {
  return Array.from(views.values()).filter((v) => !v.final && v.turnId);
}

function refreshControls() {
  const active = running();
  els.queue.hidden = active.length === 0;
  const stoppable = active.find((v) => v.el.dataset.state === "running" && !v.stopping);
  els.stop.disabled = !stoppable;
}

// ------------------------------------------------------------------ driving turns

/** Read a turn's stream into its view until its terminal frame. */
async function drive(view, stream) {
  view.stream = stream;
  stream.view = view;
  try {
    for await (const event of stream) view.apply(event);
  } catch (error) {
    if (!view.final) {
      view.final = true;
      view.show("failed", "failed: " + describe(error));
    }
  } finally {
    refreshControls();
    if (!view.hasUser) syncTranscript();
  }
}

async function send(message, priority) {
  let options = {};
  const raw = els.options.value.trim();
  if (raw) {
    try {
      options = JSON.parse(raw);
    } catch {
      setStatus("turn options: not JSON");
      return;
    }
  }
  setStatus("");
  const view = new TurnView(message);
  scrollDown();
  const submit = { agentRef: AGENT_REF, input: message, submitOptions: options };
  if (priority) submit.priority = priority;
  const stream = client.stream(sessionId, submit);
  const connected = stream.connected.then((ok) => {
    if (ok) {
      view.setTurn(stream.turnId, stream.acceptedBy);
      remember(stream.turnId, message);
      if (!view.started) view.show("queued");
      follow();
    }
  });
  submitting.add(connected);
  connected.finally(() => submitting.delete(connected));
  await drive(view, stream);
}

/** Follow a turn found elsewhere (another tab, or running before this page loaded). */
async function adopt(turnId) {
  if (views.has(turnId)) return;
  await Promise.all(Array.from(submitting));  // a turn of this tab is not someone else's
  if (views.has(turnId)) return;
  const view = new TurnView(sent[turnId] ?? null);
  view.setTurn(turnId, null);
  view.show("queued");
  await drive(view, client.followTurn(sessionId, turnId));
}

/** The session's live stream: every turn it shows that this page does not know is adopted. */
function follow() {
  if (follower !== null) return;
  follower = client.followSession(sessionId);
  const stream = follower;
  stream.connected.then((ok) => { if (ok) syncTranscript(); });
  (async () => {
    try {
      for await (const event of stream) {
        if (event.type === "gap") syncTranscript();
        else if (event.turn_id && !views.has(event.turn_id)) adopt(event.turn_id);
      }
    } catch (error) {
      setStatus("session stream: " + describe(error));
    } finally {
      if (follower === stream) follower = null;
    }
  })();
}

/** Render the committed entries past `version`: new turns, and the user text of known ones. */
async function syncTranscript() {
  let entries;
  try {
    entries = (await client.transcript(sessionId, { after: version })).entries;
  } catch (error) {
    if (!(error instanceof SticklessError && error.code === "UNKNOWN_SESSION")) {
      setStatus("history: " + describe(error));
    }
    return false;
  }
  version += entries.length;
  for (const entry of entries) {
    let view = views.get(entry.turn_id);
    if (!view) {
      view = new TurnView(null);
      view.setTurn(entry.turn_id, null);
      view.final = true;
      view.show("completed");
    }
    if (entry.role === "user" && !view.hasUser) view.setUser(entry.content);
    if (entry.role === "assistant" && view.final && !view.raw) view.setText(entry.content);
  }
  refreshControls();
  return true;
}

/** On open: the history, the turn running now (if any), then the live session stream. */
async function open() {
  setStatus("");
  const exists = await syncTranscript();
  if (!exists) return;  // a new session: followed from its first submit
  // This tab's turns that are not history (running, queued, or ended uncommitted): shown again
  // from the event log.
  for (const turnId of Object.keys(sent)) adopt(turnId);
  try {
    const status = await client.status(sessionId);
    if (status.active_turn_id) adopt(status.active_turn_id);
  } catch (error) {
    setStatus("status: " + describe(error));
  }
  follow();
}

async function stop() {
  const view = running().find((v) => v.el.dataset.state === "running");
  if (!view) return;
  view.stopping = true;
  view.show(view.el.dataset.state, "stopping\u2026");
  try {
    const answer = await client.interrupt(sessionId,
      { turnId: view.turnId, reason: "stopped from the chat page" });
    if (!answer.interrupted && !view.final) view.note.textContent = "nothing to stop";
  } catch (error) {
    setStatus("stop: " + describe(error));
    view.stopping = false;
    refreshControls();
  }
}

// ------------------------------------------------------------------ wiring

els.form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const message = els.input.value.trim();
  if (!message) return;
  els.input.value = "";
  // While a turn runs, the message queues with the chosen priority (NEXT unless chosen).
  send(message, running().length ? els.priority.value : null);
  els.priority.value = "NEXT";
});
els.input.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    els.form.requestSubmit();
  }
});
els.stop.addEventListener("click", stop);
els.newSession.addEventListener("click", () => { location.search = ""; });
els.auth.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = els.token.value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  client.token = token;
  els.token.value = "";
  els.auth.hidden = true;
  open();
});

// Test hook: drop the connections of the running turns, as a network failure would.
window.sticklessChat = {
  dropConnection() {
    const active = running().filter((v) => v.stream && !v.stream.ended);
    for (const view of active) view.stream.drop();
    return active.length > 0;
  },
  get sessionId() { return sessionId; },
  get busy() { return running().length > 0; },
};

open();
els.input.focus();
