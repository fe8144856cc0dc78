// stickless.js: a client of the stickless HTTP/SSE gateway (see README.md, "Serve over HTTP").
// An ES module with no dependency, for browsers and Node 18+ (it needs fetch, ReadableStream and
// TextDecoder). Served by `stickless serve` at /static/stickless.js; types in stickless.d.ts.

/** The frames that end a turn (unless `retrying`: then only that attempt ended). */
export const TERMINAL_EVENTS = Object.freeze(
  ["turn_completed", "turn_failed", "interrupted", "rejected"]);

/** HTTP answers a retry can fix: the balancer found no node, or the node's store is away. */
const RETRYABLE_STATUS = new Set([429, 502, 503, 504]);

/** An answer of the gateway that is not a success: `status`, and the error body's `code`. */
export class SticklessError extends Error {
  constructor(status, code, message) {
    super(message ? `${code}: ${message}` : code);
    this.name = "SticklessError";
    this.status = status;
    this.code = code;
    this.detail = message;
  }
}

/** Orders two event ids ("<ms>-<n>" or "<ms>"): negative, zero or positive. */
export function compareEventIds(a, b) {
  const [am, an = "0"] = a.split("-");
  const [bm, bn = "0"] = b.split("-");
  const x = BigInt(am) - BigInt(bm) || BigInt(an) - BigInt(bn);
  return x < 0n ? -1 : x > 0n ? 1 : 0;
}

/** A fresh random key (hex), for idempotency keys and session ids. */
export function randomId(bytes = 12) {
  const raw = new Uint8Array(bytes);
  globalThis.crypto.getRandomValues(raw);
  return Array.from(raw, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The frames of an event-stream body: `{id, event, data, retry}` per dispatched frame (comments,
 * the keep-alives, are skipped). Ends when the body ends; throws when the connection breaks.
 */
export async function* readEventStream(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let frame = { id: null, event: "message", data: [], retry: null };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      // Normalise line ends, keeping a trailing \r until we know whether \n follows.
      const keepCr = buffer.endsWith("\r");
      if (keepCr) buffer = buffer.slice(0, -1);
      buffer = buffer.replace(/\r\n?/g, "\n");
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (line === "") {
          if (frame.data.length || frame.retry !== null) {
            yield { id: frame.id, event: frame.event, data: frame.data.join("\n"),
                    retry: frame.retry };
          }
          frame = { id: null, event: "message", data: [], retry: null };
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let field = colon < 0 ? "" : line.slice(colon + 1);
        if (field.startsWith(" ")) field = field.slice(1);
        if (name === "data") frame.data.push(field);
        else if (name === "event") frame.event = field;
        else if (name === "id") frame.id = field;
        else if (name === "retry" && /^\d+$/.test(field)) frame.retry = Number(field);
      }
      if (keepCr) buffer += "\r";
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

const sleep = (ms, signal) => new Promise((resolve) => {
  if (signal && signal.aborted) { resolve(); return; }
  const timer = setTimeout(done, ms);
  function done() {
    clearTimeout(timer);
    if (signal) signal.removeEventListener("abort", done);
    resolve();
  }
  if (signal) signal.addEventListener("abort", done);
});

async function errorOf(response) {
  let code = `HTTP_${response.status}`;
  let message = "";
  try {
    const body = await response.json();
    const err = body.error || body;
    code = err.code || code;
    message = err.message || "";
  } catch {
    // not JSON (a balancer's error page): the status says it
  }
  return new SticklessError(response.status, code, message);
}

const isTerminal = (event) => TERMINAL_EVENTS.includes(event.type) && !event.retrying;

/** The terminal frame a turn's stored answer stands for (the turn lookup's view). */
export function terminalOf(view) {
  const common = { session_id: view.session_id, turn_id: view.turn_id, attempt: view.attempt,
                   event_id: null, executed_by: view.executed_by || "", retrying: false };
  if (view.state === "completed") {
    return { ...common, type: "turn_completed", text: view.result ? view.result.text : "",
             data: view.result ? view.result.data : {} };
  }
  const error = view.error || { code: "FAILED", message: "" };
  if (error.code === "INTERRUPTED") {
    return { ...common, type: "interrupted", reason: error.message };
  }
  return { ...common, type: "turn_failed", code: error.code, message: error.message };
}

/**
 * A stream of a turn's or a session's events that resumes by itself: a dropped connection, a
 * 5xx or a node that died is reconnected with `Last-Event-ID` after a backoff, and a frame
 * already seen is skipped (event ids grow along a session's log, so one not past the last id
 * seen is a replay). Iterate it with `for await`; `close()` ends it.
 */
export class EventStream {
  constructor(client, { sessionId, turnId = null, after = null, open = null, signal = null }) {
    this.client = client;
    this.sessionId = sessionId;
    /** The turn streamed (known once the submit answered), or null for a session stream. */
    this.turnId = turnId;
    this.lastEventId = after;
    /** Connections made again after the first. */
    this.reconnects = 0;
    /** The node that accepted a submitted turn, and how ("new", "attached", "cached"). */
    this.acceptedBy = null;
    this.origin = null;
    this.ended = false;
    this._session = turnId === null && open === null;
    this._open = open;
    this._controller = new AbortController();
    this._connection = null;
    /** Resolves true once a connection is open (a session stream then hears every new frame),
     * false if the stream ended before. */
    this.connected = new Promise((resolve) => { this._onConnected = resolve; });
    if (signal) {
      if (signal.aborted) this.close();
      else signal.addEventListener("abort", () => this.close(), { once: true });
    }
  }

  /** Stop: the connection is aborted and the iteration ends (the turn goes on). */
  close() {
    this.ended = true;
    this._controller.abort();
  }

  /** Break the current connection only, as a network failure would: the stream resumes. */
  drop() {
    if (this._connection) this._connection.abort();
  }

  [Symbol.asyncIterator]() {
    return this._frames();
  }

  async *_frames() {
    const { backoff } = this.client.options;
    this._delay = backoff.first;
    this._failures = 0;
    try {
      for (let first = true; !this.ended; first = false) {
        if (!first) {
          this.reconnects += 1;
          await sleep(this._delay, this._controller.signal);
          this._delay = Math.min(this._delay * 2, backoff.max);
          if (this.ended) return;
        }
        const connection = new AbortController();
        const abort = () => connection.abort();
        this._connection = connection;
        this._controller.signal.addEventListener("abort", abort, { once: true });
        try {
          yield* this._connectionFrames(connection.signal);
        } finally {
          this._controller.signal.removeEventListener("abort", abort);
        }
      }
    } finally {
      this.ended = true;
      this._connection = null;
      this._onConnected(false);
    }
  }

  /** The frames of one connection; returns when it ends or breaks (then the caller resumes).
   *
   * Raises: SticklessError, an answer no retry fixes (or too many failures in a row). */
  async *_connectionFrames(signal) {
    const { retries, backoff, onRetry } = this.client.options;
    let response;
    try {
      response = await this._connect(signal);
    } catch (error) {
      if (this.ended) return;
      const retryable = error instanceof TypeError || error.name === "AbortError" ||
        (error instanceof SticklessError && RETRYABLE_STATUS.has(error.status));
      this._failures += 1;
      if (!retryable || this._failures > retries) throw error;
      if (onRetry) onRetry({ stream: this, error, attempt: this._failures, delay: this._delay });
      return;
    }
    this._onConnected(true);
    if (response.status === 204) {  // the turn ended and nothing is left past the cursor
      yield await this._settle();
      return;
    }
    this._failures = 0;
    this._delay = backoff.first;
    if (this._session && this.reconnects > 0 && this.lastEventId === null) {
      // A session stream resumed without a cursor: what was sent meanwhile cannot be named.
      yield { type: "gap", cursor: null, oldest_id: null };
    }
    try {
      for await (const frame of readEventStream(response.body)) {
        const item = this._item(frame);
        if (item === null) continue;
        if (item.type === "error") return;  // the node ended the stream: resume elsewhere
        yield item;
        if (this.ended) return;  // closed by the consumer while it held the item
        if (this.turnId !== null && isTerminal(item)) {
          this.ended = true;
          return;
        }
      }
    } catch (error) {
      if (!this.ended && onRetry) onRetry({ stream: this, error, attempt: 0, delay: this._delay });
    }
  }

  /** One SSE frame as what the stream yields, or null when it is a replay or empty. */
  _item(frame) {
    if (!frame.data) return null;
    let data;
    try {
      data = JSON.parse(frame.data);
    } catch {
      return null;
    }
    if (frame.event === "gap") return { type: "gap", ...data };
    if (frame.event === "error") return { type: "error", ...data };
    if (frame.id !== null) {
      if (this.lastEventId !== null && compareEventIds(frame.id, this.lastEventId) <= 0) {
        return null;
      }
      this.lastEventId = frame.id;
    }
    return data;
  }

  async _connect(signal) {
    if (this.turnId === null && this._open !== null) {
      const response = await this._open(signal);
      this.turnId = response.headers.get("X-Turn-Id");
      this.acceptedBy = response.headers.get("X-Node-Id");
      this.origin = response.headers.get("X-Origin");
      return response;
    }
    const headers = { Accept: "text/event-stream" };
    if (this.lastEventId !== null) headers["Last-Event-ID"] = this.lastEventId;
    const base = `/v1/sessions/${encodeURIComponent(this.sessionId)}`;
    const path = this.turnId === null
      ? `${base}/events` : `${base}/turns/${encodeURIComponent(this.turnId)}/events`;
    return this.client._fetch("GET", path, { headers, signal, ok: [200, 204] });
  }

  async _settle() {
    this.ended = true;
    return terminalOf(await this.client.turn(this.sessionId, this.turnId));
  }
}

/**
 * The gateway's client: `new Client({baseUrl, token})`. Every call retries what a retry can fix
 * (a network error, 502/503/504/429) with backoff; a submit keeps its Idempotency-Key across
 * retries, so it never makes a second turn.
 */
export class Client {
  constructor(options = {}) {
    this.options = {
      baseUrl: (options.baseUrl || "").replace(/\/+$/, ""),
      fetch: options.fetch || globalThis.fetch.bind(globalThis),
      retries: options.retries ?? 8,
      backoff: { first: 200, max: 3000, ...(options.backoff || {}) },
      onRetry: options.onRetry || null,
    };
    /** The bearer token sent as `Authorization: Bearer <token>` (null: none). */
    this.token = options.token || null;
  }

  async _fetch(method, path, { body, headers = {}, signal, query, ok = [200] } = {}) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query || {})) {
      if (value !== undefined && value !== null) params.set(name, String(value));
    }
    const search = params.toString();
    const sent = { ...headers };
    if (this.token) sent.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) sent["Content-Type"] = "application/json";
    const target = this.options.baseUrl + path + (search ? `?${search}` : "");
    const response = await this.options.fetch(target, {
      method, headers: sent, signal, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!ok.includes(response.status)) throw await errorOf(response);
    return response;
  }

  /** `_fetch` retried on a network error or a retryable status, with backoff. */
  async _call(method, path, options = {}) {
    const { retries, backoff, onRetry } = this.options;
    let delay = backoff.first;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this._fetch(method, path, options);
      } catch (error) {
        const retryable = error instanceof TypeError ||
          (error instanceof SticklessError && RETRYABLE_STATUS.has(error.status));
        if (!retryable || attempt > retries || (options.signal && options.signal.aborted)) {
          throw error;
        }
        if (onRetry) onRetry({ stream: null, error, attempt, delay });
        await sleep(delay, options.signal);
        delay = Math.min(delay * 2, backoff.max);
      }
    }
  }

  async _json(method, path, options) {
    return (await this._call(method, path, options)).json();
  }

  static _base(sessionId) {
    return `/v1/sessions/${encodeURIComponent(sessionId)}`;
  }

  static _body(message) {
    const body = { agent_ref: message.agentRef, input: message.input };
    if (message.priority) body.priority = message.priority;
    if (message.submitOptions) body.submit_options = message.submitOptions;
    return body;
  }

  /** Submit a turn: `{turn_id, session_id, status, origin, trace_id}` (HTTP 202). */
  async submit(sessionId, message) {
    const key = message.idempotencyKey || randomId();
    return this._json("POST", `${Client._base(sessionId)}/turns`, {
      body: Client._body(message), headers: { "Idempotency-Key": key }, ok: [202],
      signal: message.signal,
    });
  }

  /** Submit a turn and stream it from its first frame to its terminal one, resuming. */
  stream(sessionId, message) {
    const key = message.idempotencyKey || randomId();
    const open = (signal) => this._fetch("POST", `${Client._base(sessionId)}/turns`, {
      body: Client._body(message), signal,
      headers: { Accept: "text/event-stream", "Idempotency-Key": key },
    });
    const stream = new EventStream(this, { sessionId, open, signal: message.signal });
    stream.idempotencyKey = key;
    return stream;
  }

  /** The turn of an idempotency key, streamed: the same submit again attaches to the turn it
   * made (running), or replays it (ended); it never makes a second turn. */
  attach(sessionId, idempotencyKey, message) {
    if (!idempotencyKey) throw new TypeError("attach: idempotencyKey is required");
    return this.stream(sessionId, { ...message, idempotencyKey });
  }

  /** A submitted turn's events (past the event id `after`, else from its first), resuming. */
  followTurn(sessionId, turnId, { after = null, signal = null } = {}) {
    return new EventStream(this, { sessionId, turnId, after, signal });
  }

  /** Every turn's events of a session, live (past `after` first, when given), resuming. */
  followSession(sessionId, { after = null, signal = null } = {}) {
    return new EventStream(this, { sessionId, after, signal });
  }

  /** The turn's state and answer; `wait` (seconds) waits up to that long for its end. */
  async turn(sessionId, turnId, { wait = 0, signal } = {}) {
    const query = wait > 0 ? { wait } : undefined;
    return this._json("GET", `${Client._base(sessionId)}/turns/${encodeURIComponent(turnId)}`,
      { query, signal });
  }

  /** Interrupt the running turn (or `turnId`, running or queued): `{interrupted}`. */
  async interrupt(sessionId, { turnId = null, reason = "USER", signal } = {}) {
    const body = { reason };
    if (turnId) body.turn_id = turnId;
    return this._json("POST", `${Client._base(sessionId)}/interrupt`,
      { body, ok: [202], signal });
  }

  /** The committed transcript `{session_id, entries}` (past version `after`). */
  async transcript(sessionId, { after = 0, signal } = {}) {
    return this._json("GET", `${Client._base(sessionId)}/transcript`,
      { query: after ? { after } : undefined, signal });
  }

  /** Best-effort status of the session across the cluster (never a control gate). */
  async status(sessionId, { signal } = {}) {
    return this._json("GET", Client._base(sessionId), { signal });
  }

  /** Drop the session's live handle and lease; its history stays. */
  async release(sessionId, { signal } = {}) {
    await this._call("POST", `${Client._base(sessionId)}/release`, { ok: [204], signal });
  }

  /** Delete the session's history. */
  async deleteSession(sessionId, { signal } = {}) {
    await this._call("DELETE", Client._base(sessionId), { ok: [204], signal });
  }
}
