// The Vercel AI SDK's own chat client (`AbstractChat`, the core of `useChat`, over its default
// `DefaultChatTransport`) against three `stickless serve` nodes behind haproxy: sending, tools
// and reasoning, resume (`resume: true` calls `resumeStream()` on a page load), stop, auth, and
// resumes after the node serving the stream, then the node running the turn, were SIGKILLed.
//
// tests/test_ai_sdk_cluster.py starts the cluster and runs this file with:
//   STICKLESS_URL    the balancer's URL
//   STICKLESS_NODES  JSON {router node id: pid} of the serve processes (this file kills some)
// The tests run in order (node:test runs one file's tests one after another).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { test } from 'node:test';

import { AbstractChat } from 'ai';

import { chatTransport, stopChat } from './chat_transport.mjs';

const BASE = process.env.STICKLESS_URL;
if (!BASE) {
  const why = 'STICKLESS_URL is not set: run this through tests/test_ai_sdk_cluster.py';
  if (process.env.CI === 'true') throw new Error(why);
  test(why, { skip: true }, () => {});
}
const NODES = JSON.parse(process.env.STICKLESS_NODES ?? '{}');
const ALICE = { Authorization: 'Bearer tok-alice' };
/** The agent's long reply (tests/ai_sdk_agent.py, STORY). */
const STORY = Array.from({ length: 40 }, (_, i) => `word${i + 1}`).join(' ');
const SLOW_STORY = { submit_options: { story: true, delay: 0.1 } };

/** The chat state a UI framework keeps (as @ai-sdk/react's), telling waiters of each change. */
class ObservedState {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
    this.listeners = new Set();
  }
  pushMessage(message) { this.messages = [...this.messages, message]; this.changed(); }
  popMessage() { this.messages = this.messages.slice(0, -1); this.changed(); }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
    this.changed();
  }
  snapshot(value) { return structuredClone(value); }
  changed() { for (const listener of [...this.listeners]) listener(); }
}

class TestChat extends AbstractChat {
  constructor(init) {
    const state = new ObservedState();
    super({ ...init, state });
    this.observed = state;
  }
  /** Resolves once `predicate(this)` holds (checked on every message change). */
  until(predicate) {
    return new Promise((resolve) => {
      const check = () => {
        if (predicate(this)) {
          this.observed.listeners.delete(check);
          resolve();
        }
      };
      this.observed.listeners.add(check);
      check();
    });
  }
}

/** A fetch that records, for every answer, its method, status and the stickless headers. */
function observingFetch(seen) {
  return async (input, init) => {
    const answer = await fetch(input, init);
    seen.push({
      method: init?.method ?? 'GET',
      status: answer.status,
      node: answer.headers.get('x-node-id'),
      turn: answer.headers.get('x-turn-id'),
      protocol: answer.headers.get('x-vercel-ai-ui-message-stream'),
    });
    return answer;
  };
}

function newChat(token = 'tok-alice') {
  const seen = [];
  const transport = chatTransport({
    baseUrl: BASE, token, agentRef: 'clock', fetch: observingFetch(seen),
  });
  return { chat: new TestChat({ id: `chat-${randomUUID()}`, transport }), seen, transport };
}

const assistant = (chat) => chat.messages.filter((m) => m.role === 'assistant').at(-1);
const textOf = (message) =>
  (message?.parts ?? []).filter((p) => p.type === 'text').map((p) => p.text).join('');
const partTypes = (message) => message.parts.map((p) => p.type).filter((t) => t !== 'step-start');
const streaming = (chat) => textOf(assistant(chat)).length > 0;

async function turnView(chatId, turnId) {
  const answer = await fetch(`${BASE}/v1/sessions/${chatId}/turns/${turnId}?wait=25`,
    { headers: ALICE });
  assert.equal(answer.status, 200);
  return answer.json();
}

/** Send cheap requests until the balancer's last answer came from `node`, so its round robin
 * gives the next request to another node. */
async function stepPast(node) {
  for (let i = 0; i < 6; i++) {
    const { node_id: answered } = await (await fetch(`${BASE}/healthz`)).json();
    if (answered === node) return;
  }
  assert.fail(`the balancer never answered from ${node}`);
}

function kill(node) {
  const pid = NODES[node];
  assert.ok(pid, `no pid for node ${node} in ${JSON.stringify(NODES)}`);
  process.kill(pid, 'SIGKILL');
}

test('a turn streams reasoning, a tool call and text into one assistant message', async () => {
  const { chat, seen, transport } = newChat();
  await chat.sendMessage({ text: 'what time is it?' }, { body: { submit_options: { tools: true } } });
  assert.equal(chat.status, 'ready', String(chat.error));
  const [post] = seen;
  assert.deepEqual([post.method, post.status, post.protocol], ['POST', 200, 'v1']);
  const reply = assistant(chat);
  assert.equal(chat.messages.length, 2);
  assert.equal(reply.id, post.turn, 'the assistant message is named by the turn id');
  assert.deepEqual(partTypes(reply), ['reasoning', 'dynamic-tool', 'text']);
  const [reasoning, tool, text] = reply.parts.filter((p) => p.type !== 'step-start');
  assert.equal(reasoning.text, 'The user wants the time; the clock knows.');
  assert.equal(reasoning.state, 'done');
  assert.deepEqual(
    [tool.toolName, tool.toolCallId, tool.state, tool.input, tool.output],
    ['clock', 'call-1', 'output-available', { tz: 'UTC' }, '12:00'],
  );
  assert.equal(text.text, 'It is 12:00 UTC. You said: what time is it?');
  assert.equal(reply.metadata.stickless.turnId, post.turn);
  assert.ok(NODES[reply.metadata.stickless.executedBy], 'executedBy names a serve node');
  // Finished: nothing to resume.
  assert.equal(await transport.reconnectToStream({ chatId: chat.id }), null);
});

test('a chat with nothing to resume answers 204, also to whoever may not see it', async () => {
  const { chat, transport } = newChat();
  assert.equal(await transport.reconnectToStream({ chatId: chat.id }), null);
  const running = chat.sendMessage({ text: 'tell a story' }, { body: SLOW_STORY });
  await chat.until(streaming);
  const bob = newChat('tok-bob');
  assert.equal(await bob.transport.reconnectToStream({ chatId: chat.id }), null);
  await assert.rejects(
    bob.transport.sendMessages({
      chatId: chat.id, trigger: 'submit-message', messageId: undefined,
      messages: [{ id: 'm-bob', role: 'user', parts: [{ type: 'text', text: 'mine?' }] }],
    }),
    /UNKNOWN_SESSION/,
  );
  await assert.rejects(stopChat(chat.id, { baseUrl: BASE, token: 'tok-bob' }), /UNKNOWN_SESSION/);
  const anonymous = newChat(null);
  await assert.rejects(
    anonymous.transport.reconnectToStream({ chatId: chat.id }), /UNAUTHENTICATED/,
  );
  assert.equal(await stopChat(chat.id, { baseUrl: BASE, token: 'tok-alice' }), true);
  await running;
});

test('the stop route interrupts the turn; the open stream ends with what was said', async () => {
  const { chat, seen } = newChat();
  const sending = chat.sendMessage({ text: 'tell a story' }, { body: SLOW_STORY });
  await chat.until(streaming);
  assert.equal(await stopChat(chat.id, { baseUrl: BASE, token: 'tok-alice' }), true);
  await sending;
  assert.equal(chat.status, 'ready', String(chat.error));
  const said = textOf(assistant(chat));
  assert.ok(said.length > 0 && said.length < STORY.length && STORY.startsWith(said), said);
  const view = await turnView(chat.id, seen[0].turn);
  assert.deepEqual([view.state, view.error.code], ['failed', 'INTERRUPTED']);
});

test('a client that leaves does not stop the turn: resumeStream() gets the whole reply', async () => {
  const { chat, seen } = newChat();
  const sending = chat.sendMessage({ text: 'tell a story' }, { body: SLOW_STORY });
  await chat.until(streaming);
  await chat.stop(); // the SDK's stop: aborts its fetch, nothing more
  await sending;
  assert.ok(textOf(assistant(chat)).length < STORY.length);
  await chat.resumeStream(); // what `useChat({ resume: true })` does on a page load
  assert.equal(chat.status, 'ready', String(chat.error));
  assert.equal(chat.messages.length, 2, 'the resumed reply replaced the partial one');
  assert.equal(assistant(chat).id, seen[0].turn);
  assert.deepEqual(partTypes(assistant(chat)), ['text']);
  assert.equal(textOf(assistant(chat)), STORY);
  assert.equal(seen.at(-1).method, 'GET');
  assert.equal((await turnView(chat.id, seen[0].turn)).state, 'completed');
});

test('the serving node SIGKILLed mid-stream: a resume on a survivor replays the turn whole',
  async () => {
    const { chat, seen } = newChat();
    await chat.sendMessage({ text: 'hello' });
    const holder = assistant(chat).metadata.stickless.executedBy;
    await stepPast(holder);
    const sending = chat.sendMessage({ text: 'tell a story' }, { body: SLOW_STORY });
    await chat.until((c) => c.messages.length === 4 && streaming(c));
    const serving = seen.at(-1).node;
    assert.notEqual(serving, holder, 'the stream is served by a node other than the holder');
    kill(serving);
    await sending;
    assert.equal(chat.status, 'error', 'the stream broke with its node');
    await chat.resumeStream();
    assert.equal(chat.status, 'ready', String(chat.error));
    assert.equal(chat.messages.length, 4);
    const reply = assistant(chat);
    assert.equal(reply.id, seen.at(-2).turn);
    assert.deepEqual(partTypes(reply), ['text'], 'one text part: no gap, no duplicate');
    assert.equal(textOf(reply), STORY);
    assert.equal(reply.metadata.stickless.executedBy, holder);
    assert.notEqual(seen.at(-1).node, serving);
  });

test('the node running the turn SIGKILLed: the resumed stream ends with HOLDER_LOST', async () => {
  const { chat, seen } = newChat();
  const sending = chat.sendMessage({ text: 'tell a story' }, { body: SLOW_STORY });
  await chat.until(streaming);
  kill(seen[0].node); // a new chat's first turn runs on the node that took it
  await sending;
  await chat.resumeStream();
  assert.equal(chat.status, 'error');
  assert.match(chat.error.message, /HOLDER_LOST/);
  const said = textOf(assistant(chat));
  assert.ok(said.length > 0 && STORY.startsWith(said), 'the replayed text so far');
  assert.equal(chat.messages.length, 2);
  assert.equal((await turnView(chat.id, seen[0].turn)).error.code, 'HOLDER_LOST');
});
