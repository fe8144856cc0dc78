import { Client } from "./stickless.js"; // in a page served by stickless: "/static/stickless.js"

export async function ask(baseUrl, token, sessionId, question) {
  const client = new Client({ baseUrl, token }); // token: null when the server has no --tokens
  // Submit and stream the turn; a dropped connection or a dead node is resumed by itself.
  const stream = client.stream(sessionId, { agentRef: "demo-agent", input: question });
  let text = "";
  for await (const event of stream) {
    if (event.type === "text_delta") text += event.text;
    if (event.type === "gap") text = ""; // frames were lost: the final text comes with the end
    if (event.type === "turn_completed") text = event.text;
    if (event.type === "turn_failed") throw new Error(`${event.code}: ${event.message}`);
  }
  const { entries } = await client.transcript(sessionId); // the committed history
  return { text, turnId: stream.turnId, history: entries.length };
}
