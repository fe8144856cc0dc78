// markdown.js: the chat page's small, safe markdown renderer (no dependency). Every character
// of the input is escaped; the only markup in the output is what this file writes: paragraphs,
// line breaks, headings, lists, quotes, code (inline and fenced), bold, italics and links whose
// address is http(s), mailto or relative. There is no raw HTML and no attribute but href/rel.

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** `text` with every HTML-significant character escaped. */
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

/** Whether a link address may be followed (http, https, mailto, or a relative one). */
export function safeHref(url) {
  const trimmed = url.trim();
  if (/^(https?:|mailto:)/i.test(trimmed)) return true;
  // Relative: no scheme before the first /, ? or # (so no javascript:, data:, vbscript:, ...).
  return !/^[^/?#]*:/.test(trimmed) && !/^\/\//.test(trimmed);
}

function emphasis(escaped) {
  return escaped
    .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
    .replace(/__(?=\S)([\s\S]*?\S)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*(?=\S)([^*]*?\S)\*(?!\*)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_(?=\S)([^_]*?\S)_(?![_\w])/g, "$1<em>$2</em>");
}

function links(text) {
  // On raw text: [label](url); everything else goes through escapeHtml and emphasis.
  const out = [];
  const pattern = /\[([^\]\n]+)\]\(([^()\s]+)\)/g;
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    out.push(emphasis(escapeHtml(text.slice(last, match.index))));
    const [whole, label, url] = match;
    if (safeHref(url)) {
      out.push(`<a href="${escapeHtml(url.trim())}" rel="noopener noreferrer nofollow" ` +
        `target="_blank">${emphasis(escapeHtml(label))}</a>`);
    } else {
      out.push(emphasis(escapeHtml(whole)));
    }
    last = match.index + whole.length;
  }
  out.push(emphasis(escapeHtml(text.slice(last))));
  return out.join("");
}

/** One line's inline markup: `code` spans first (nothing inside them is markup). */
export function inline(text) {
  return text.split(/(`[^`\n]+`)/g).map((part, i) =>
    i % 2 === 1 ? `<code>${escapeHtml(part.slice(1, -1))}</code>` : links(part)).join("");
}

function listItem(line) {
  const match = /^\s*(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(line);
  if (!match) return null;
  return { ordered: match[2] !== undefined, text: match[3] };
}

/** `source` (markdown) as HTML in which all of the source's text is escaped. */
export function renderMarkdown(source) {
  const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
  const html = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (/^\s*```/.test(line)) {
      const body = [];
      i += 1;
      while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
      i += 1;  // the closing fence (or the end: an unclosed block runs to the end)
      html.push(`<pre><code>${escapeHtml(body.join("\n"))}</code></pre>`);
      continue;
    }
    if (line.trim() === "") { i += 1; continue; }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      const level = heading[1].length;
      html.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      i += 1;
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) {
        quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      }
      html.push(`<blockquote>${renderMarkdown(quoted.join("\n"))}</blockquote>`);
      continue;
    }
    const item = listItem(line);
    if (item) {
      const tag = item.ordered ? "ol" : "ul";
      const items = [];
      let next;
      while (i < lines.length && (next = listItem(lines[i])) && next.ordered === item.ordered) {
        items.push(`<li>${inline(next.text)}</li>`);
        i += 1;
      }
      html.push(`<${tag}>${items.join("")}</${tag}>`);
      continue;
    }
    const paragraph = [];
    while (i < lines.length && lines[i].trim() !== "" && !/^\s*(```|>|#{1,6}\s)/.test(lines[i]) &&
           !listItem(lines[i])) {
      paragraph.push(inline(lines[i++]));
    }
    html.push(`<p>${paragraph.join("<br>")}</p>`);
  }
  return html.join("");
}
