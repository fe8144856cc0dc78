// stickless.js against real `stickless serve` nodes over one redis-server.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { Client, SticklessError, compareEventIds, randomId } from "../stickless.js";
import { ask } from "../example.mjs";
import { Node, missing, tokensFile } from "./harness.mjs";

const TOKEN = "js-test-token";
const AGENT = "demo-agent";
const why = missing();
if (why !== null && process.env.CI === "true") throw new Error(why);

/** Everything a stream yields, in order. */
async function collect(stream, onItem = () => {}) {
  const items = [];
  for await (const item of stream) {
    items.push(item);
    await onItem(item, items);
  }
  return items;
}

const words = (items) => items.filter((e) => e.type === "text_delta").map((e) => e.text).join("");

/** Every id once, each past the one before: nothing replayed twice. */
function assertIncreasing(items) {
  const ids = items.map((e) => e.event_id).filter((id) => id);
  for (let i = 1; i < ids.length; i++) {
    assert.ok(compareEventIds(ids[i - 1], ids[i]) < 0, `${ids[i - 1]} then ${ids[i]}`);
  }
}

describe("stickless.js against stickless serve", { skip: why || false }, () => {
  const tokens = why ? null : tokensFile({ [TOKEN]: "alice" });
  const a = new Node("js-a", { tokens });
  const b = new Node("js-b", { tokens });
  let client;
  const session = () => `js-${randomId(6)}`;

  before(async () => {
    await Promise.all([a.start(), b.start()]);
    client = new Client({ baseUrl: a.url, token: TOKEN, backoff: { first: 100, max: 1000 } });
  });
  after(async () => {
    await Promise.all([a.stop(), b.stop()]);
  });

  test("submit, then the turn, its events, the transcript and the status", async () => {
    const sid = session();
    const accepted = await client.submit(sid, { agentRef: AGENT, input: "hello" });
    assert.equal(accepted.origin, "new");
    const view = await client.turn(sid, accepted.turn_id, { wait: 20 });
    assert.equal(view.state, "completed");
    assert.equal(view.result.text, "you said 'hello'; this handle has now run 1 turn(s)");
    const items = await collect(client.followTurn(sid, accepted.turn_id));
    assert.equal(items[0].type, "turn_started");
    assert.equal(items.at(-1).type, "turn_completed");
    assert.equal(words(items).trim(), view.result.text);
    const transcript = await client.transcript(sid);
    assert.deepEqual(transcript.entries.map((e) => [e.role, e.content, e.turn_id]), [
      ["user", "hello", accepted.turn_id],
      ["assistant", view.result.text, accepted.turn_id],
    ]);
    assert.deepEqual((await client.transcript(sid, { after: 1 })).entries.length, 1);
    assert.equal((await client.status(sid)).session_id, sid);
  });

  test("stream a submit; the same key attaches to the running turn, then replays it", async () => {
    const sid = session();
    const message = { agentRef: AGENT, input: "story", submitOptions: { story: true, delay: 0.02 } };
    const first = client.stream(sid, message);
    let attached = null;
    const own = await collect(first, (item, items) => {
      if (attached === null && items.length === 3) {
        attached = collect(client.attach(sid, first.idempotencyKey, message));
      }
    });
    assert.equal(first.origin, "new");
    assert.ok([a.nodeId, b.nodeId].includes(first.acceptedBy));
    const joined = await attached;
    const replayed = client.attach(sid, first.idempotencyKey, message);
    const cached = await collect(replayed);
    assert.equal(replayed.origin, "cached");
    assert.equal(replayed.turnId, first.turnId);
    const end = own.at(-1);
    assert.equal(end.type, "turn_completed");
    assert.equal(words(own).trim(), end.text);
    // Every reader saw the same frames, from the first: nothing lost, nothing twice.
    const ids = (items) => items.map((e) => e.event_id);
    assert.deepEqual(ids(joined), ids(own));
    assert.deepEqual(ids(cached), ids(own));
    assertIncreasing(own);
  });

  test("a dropped connection resumes past the last event id", async () => {
    const sid = session();
    const stream = client.stream(sid, {
      agentRef: AGENT, input: "story", submitOptions: { story: true, delay: 0.03 } });
    const items = await collect(stream, (item, seen) => {
      const deltas = seen.filter((e) => e.type === "text_delta").length;
      if (item.type === "text_delta" && (deltas === 4 || deltas === 12)) stream.drop();
    });
    assert.ok(stream.reconnects >= 2, `reconnects ${stream.reconnects}`);
    const end = items.at(-1);
    assert.equal(end.type, "turn_completed");
    assert.deepEqual(words(items).split(" ").filter(Boolean), end.text.split(" "));
    assertIncreasing(items);
  });

  test("the serving node killed mid-stream, another started on its port: resumed whole", async () => {
    const sid = session();
    // The session's holder is b: the turn runs there while a serves its stream.
    const onB = new Client({ baseUrl: b.url, token: TOKEN });
    await onB.turn(sid, (await onB.submit(sid, { agentRef: AGENT, input: "hi" })).turn_id,
      { wait: 20 });
    const retries = [];
    const viaA = new Client({ baseUrl: a.url, token: TOKEN, retries: 30,
      backoff: { first: 100, max: 500 }, onRetry: (info) => retries.push(info) });
    const stream = viaA.stream(sid, {
      agentRef: AGENT, input: "story", submitOptions: { story: true, delay: 0.1 } });
    let restarted = null;
    const items = await collect(stream, async (item, seen) => {
      if (restarted === null && seen.filter((e) => e.type === "text_delta").length === 5) {
        await a.stop("SIGKILL");
        restarted = a.start();  // the same port: the stream's next connections reach it
      }
    });
    await restarted;
    assert.ok(retries.length >= 1 && stream.reconnects >= 1);
    const end = items.at(-1);
    assert.equal(end.type, "turn_completed", JSON.stringify(end));
    assert.equal(end.executed_by, b.nodeId);
    assert.deepEqual(words(items).split(" ").filter(Boolean), end.text.split(" "));
    assertIncreasing(items);
  });

  test("a session's events, resumed, and a gap where the log dropped frames", async () => {
    const sid = session();
    // A session exists (and is visible to its creator) once a turn was submitted to it.
    const before = await collect(client.stream(sid, { agentRef: AGENT, input: "one" }));
    const follow = client.followSession(sid);
    const seen = collect(follow, (item, items) => {
      if (items.length === 4) follow.drop();
      if (items.filter((e) => e.type === "turn_completed").length === 2) follow.close();
    });
    assert.equal(await follow.connected, true);  // live from here: then submit
    const second = await client.submit(sid, { agentRef: AGENT, input: "two" });
    const third = await client.submit(sid, { agentRef: AGENT, input: "three" });
    const items = await seen;
    assert.ok(follow.reconnects >= 1);
    assert.deepEqual([...new Set(items.map((e) => e.turn_id))], [second.turn_id, third.turn_id]);
    assert.ok(!items.some((e) => e.type === "gap"), JSON.stringify(items));
    assert.equal(items.filter((e) => e.type === "turn_started").length, 2);
    assertIncreasing(items);
    // The session deleted (its log emptied, its ids kept), then a new turn: a cursor from
    // before is past frames the log dropped, so the stream starts with a gap, then goes on with
    // what the log still holds.
    await client.deleteSession(sid);
    assert.equal(await client.transcript(sid).catch((e) => e.code), "UNKNOWN_SESSION");
    const fourth = await client.submit(sid, { agentRef: AGENT, input: "four" });
    const cursor = before[0].event_id;
    const again = client.followSession(sid, { after: cursor });
    const replay = await collect(again, (item) => {
      if (item.type === "turn_completed") again.close();
    });
    assert.deepEqual(replay[0], { type: "gap", cursor, oldest_id: null });
    assert.deepEqual([...new Set(replay.slice(1).map((e) => e.turn_id))], [fourth.turn_id]);
    assert.equal(replay[1].type, "turn_started");
    assert.match(replay.at(-1).text, /^you said 'four'/);
  });

  test("a finished turn past its last frame settles from its answer", async () => {
    const sid = session();
    const items = await collect(client.stream(sid, { agentRef: AGENT, input: "x" }));
    const last = items.at(-1);
    const settled = await collect(client.followTurn(sid, last.turn_id, { after: last.event_id }));
    assert.equal(settled.length, 1);
    assert.equal(settled[0].type, "turn_completed");
    assert.equal(settled[0].text, last.text);
  });

  test("interrupt ends the running turn", async () => {
    const sid = session();
    const stream = client.stream(sid, {
      agentRef: AGENT, input: "story", submitOptions: { story: true, delay: 0.1 } });
    const items = await collect(stream, async (item, seen) => {
      if (seen.filter((e) => e.type === "text_delta").length === 2 && item.type === "text_delta") {
        assert.deepEqual(await client.interrupt(sid, { turnId: stream.turnId, reason: "enough" }),
          { interrupted: true });
      }
    });
    assert.equal(items.at(-1).type, "interrupted");
    assert.equal(items.at(-1).reason, "enough");
  });

  test("the README's example", async () => {
    const sid = session();
    const answer = await ask(a.url, TOKEN, sid, "hi");
    assert.deepEqual(answer.text, "you said 'hi'; this handle has now run 1 turn(s)");
    assert.equal(answer.history, 2);
    assert.equal((await client.turn(sid, answer.turnId)).state, "completed");
  });

  test("errors: no token is a 401, a bad priority a 400 naming the field", async () => {
    const anonymous = new Client({ baseUrl: a.url });
    await assert.rejects(anonymous.status("js-nobody"),
      (e) => e instanceof SticklessError && e.status === 401 && e.code === "UNAUTHENTICATED");
    await assert.rejects(client.submit(session(), { agentRef: AGENT, input: "x", priority: "SOON" }),
      (e) => e.status === 400 && e.code === "INVALID_REQUEST" && /priority/.test(e.message));
    const stream = anonymous.stream(session(), { agentRef: AGENT, input: "x" });
    await assert.rejects(collect(stream), (e) => e.status === 401);
  });
});
