// Types of stickless.js, the client of the stickless HTTP/SSE gateway.

export type Priority = "NOW" | "NEXT" | "LATER";

/** Fields every turn frame carries. */
export interface FrameBase {
  session_id: string;
  turn_id: string;
  /** The run of the turn (1-based); a new attempt runs the agent again from the start. */
  attempt: number;
  seq: number;
  /** The event log id (null for a frame made from the stored answer). */
  event_id: string | null;
  trace_id?: string;
  span_id?: string;
}

interface TerminalBase extends FrameBase {
  executed_by: string;
  /** Only this attempt ended: the turn runs again, so the frame does not end it. */
  retrying: boolean;
}

export interface TurnStarted extends FrameBase { type: "turn_started"; executed_by: string; token: number }
export interface TextDelta extends FrameBase { type: "text_delta"; text: string }
export interface ReasoningDelta extends FrameBase { type: "reasoning_delta"; text: string }
export interface ToolUseStarted extends FrameBase {
  type: "tool_use_started"; tool_use_id: string; name: string; input_summary: Record<string, unknown>;
}
export interface ToolUseFinished extends FrameBase {
  type: "tool_use_finished"; tool_use_id: string; name: string; ok: boolean; output_summary: string;
}
export interface MessageCompleted extends FrameBase { type: "message_completed"; text: string }
export interface TurnCompleted extends TerminalBase {
  type: "turn_completed"; text: string; data: Record<string, unknown>;
}
export interface TurnFailed extends TerminalBase { type: "turn_failed"; code: string; message: string }
export interface Interrupted extends TerminalBase { type: "interrupted"; reason: string }
export interface Rejected extends TerminalBase { type: "rejected"; reason: string; message: string }

export type TerminalEvent = TurnCompleted | TurnFailed | Interrupted | Rejected;
export type TurnEvent =
  | TurnStarted | TextDelta | ReasoningDelta | ToolUseStarted | ToolUseFinished | MessageCompleted
  | TerminalEvent;

/** Frames after `cursor` are gone (trimmed, expired, or a session stream resumed without a
 * cursor: then both are null); the stream goes on from what the log still holds. */
export interface Gap { type: "gap"; cursor: string | null; oldest_id: string | null }

export type StreamItem = TurnEvent | Gap;

export declare const TERMINAL_EVENTS: readonly ["turn_completed", "turn_failed", "interrupted", "rejected"];

export declare class SticklessError extends Error {
  /** The HTTP status. */
  status: number;
  /** The error body's code (UNAUTHENTICATED, UNKNOWN_SESSION, ...), or HTTP_<status>. */
  code: string;
  detail: string;
}

export interface RetryInfo { stream: EventStream | null; error: unknown; attempt: number; delay: number }

export interface ClientOptions {
  /** Where the gateway is ("" in a page it served). */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string | null;
  fetch?: typeof globalThis.fetch;
  /** Failed attempts in a row before a call or a stream gives up (default 8). */
  retries?: number;
  /** Milliseconds before the first retry, doubling up to `max` (default 200 and 3000). */
  backoff?: { first?: number; max?: number };
  onRetry?: (info: RetryInfo) => void;
}

export interface Message {
  agentRef: string;
  /** The message text, or its parts. */
  input: string | Array<Record<string, unknown>>;
  priority?: Priority;
  submitOptions?: Record<string, unknown>;
  /** Made up when absent; kept across retries, so a retry never makes a second turn. */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface TurnAccepted {
  turn_id: string;
  session_id: string;
  status: "queued" | "running" | "completed" | "failed";
  origin: "new" | "attached" | "cached";
  trace_id: string | null;
}

export interface TurnView {
  turn_id: string;
  session_id: string;
  state: "queued" | "running" | "completed" | "failed";
  executed_by: string | null;
  attempt: number;
  result?: { text: string; data: Record<string, unknown> };
  error?: { code: string; message: string };
}

export interface TranscriptEntry {
  role: string;
  content: string;
  data: Record<string, unknown>;
  turn_id: string;
  token: number;
}

export interface Transcript { session_id: string; entries: TranscriptEntry[] }

export interface SessionStatus {
  session_id: string;
  holder: string | null;
  token: number | null;
  state: "RUNNING" | "IDLE" | "GONE" | "HELD" | "UNHELD";
  active_turn_id: string | null;
  queued: number;
  pending: number;
  oldest_pending_idle: number | null;
  seq: number;
  origin: string | null;
  updated_at: number;
  observed_by: string;
}

/** A turn's (ending after its terminal frame) or a session's events, resuming by itself. */
export declare class EventStream implements AsyncIterable<StreamItem> {
  readonly sessionId: string;
  /** The turn streamed (a submitted one's once the submit answered); null for a session. */
  turnId: string | null;
  /** The last event id seen: the resume cursor. */
  lastEventId: string | null;
  /** Connections made again after the first. */
  reconnects: number;
  /** Of a submitted turn: the node that accepted it, and how. */
  acceptedBy: string | null;
  origin: "new" | "attached" | "cached" | null;
  /** The Idempotency-Key of a submitted turn. */
  idempotencyKey?: string;
  ended: boolean;
  /** Resolves true once a connection is open (a session stream then hears every new frame),
   * false if the stream ended before. */
  connected: Promise<boolean>;
  close(): void;
  /** Break the current connection only, as a network failure would: the stream resumes. */
  drop(): void;
  [Symbol.asyncIterator](): AsyncIterator<StreamItem>;
}

export declare class Client {
  constructor(options?: ClientOptions);
  token: string | null;
  submit(sessionId: string, message: Message): Promise<TurnAccepted>;
  stream(sessionId: string, message: Message): EventStream;
  attach(sessionId: string, idempotencyKey: string, message: Message): EventStream;
  followTurn(sessionId: string, turnId: string,
             options?: { after?: string | null; signal?: AbortSignal | null }): EventStream;
  followSession(sessionId: string,
                options?: { after?: string | null; signal?: AbortSignal | null }): EventStream;
  turn(sessionId: string, turnId: string, options?: { wait?: number; signal?: AbortSignal }): Promise<TurnView>;
  interrupt(sessionId: string, options?: { turnId?: string | null; reason?: string; signal?: AbortSignal }):
    Promise<{ interrupted: boolean }>;
  transcript(sessionId: string, options?: { after?: number; signal?: AbortSignal }): Promise<Transcript>;
  status(sessionId: string, options?: { signal?: AbortSignal }): Promise<SessionStatus>;
  release(sessionId: string, options?: { signal?: AbortSignal }): Promise<void>;
  deleteSession(sessionId: string, options?: { signal?: AbortSignal }): Promise<void>;
}

export declare function compareEventIds(a: string, b: string): number;
export declare function randomId(bytes?: number): string;
export declare function terminalOf(view: TurnView): TerminalEvent;
export declare function readEventStream(body: ReadableStream<Uint8Array>):
  AsyncGenerator<{ id: string | null; event: string; data: string; retry: number | null }>;
