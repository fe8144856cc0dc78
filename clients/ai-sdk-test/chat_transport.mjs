// useChat against stickless: the AI SDK's own transport, pointed at stickless's routes.
//
//   const { messages, sendMessage, status } = useChat({
//     id: chatId, resume: true, transport: chatTransport({ token, agentRef: 'assistant' }),
//   });
//   <button onClick={() => stopChat(chatId, { token })}>Stop</button>
import { DefaultChatTransport } from 'ai';

export const API = '/v1/ai-sdk/chat';

const auth = (token) => (token ? { Authorization: `Bearer ${token}` } : {});

/** The SDK's default HTTP transport for stickless (other options go to it unchanged). */
export function chatTransport({ baseUrl = '', token, agentRef, ...options }) {
  return new DefaultChatTransport({
    api: `${baseUrl}${API}`, headers: auth(token), body: { agent_ref: agentRef }, ...options,
  });
}

/** Stop the chat's turn wherever it runs; its open streams then end with an `abort` part.
 * (The SDK's `stop()` only closes this tab's stream: the turn goes on, and a reload resumes it.) */
export async function stopChat(chatId, { baseUrl = '', token } = {}) {
  const url = `${baseUrl}${API}/${encodeURIComponent(chatId)}/stop`;
  const answer = await fetch(url, { method: 'POST', headers: auth(token) });
  if (!answer.ok) throw new Error(await answer.text());
  return (await answer.json()).interrupted;
}
