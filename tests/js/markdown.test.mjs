// The chat page's markdown renderer: what it formats, and that no input makes markup of its own.
import { test } from "node:test";
import assert from "node:assert/strict";

import { escapeHtml, renderMarkdown, safeHref } from "../../stickless/web/static/markdown.js";

/** Every tag the renderer may write; anything else in its output came from the input. */
const ALLOWED = new Set(["p", "br", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li",
  "blockquote", "pre", "code", "strong", "em", "a"]);

function assertOnlyOwnMarkup(html) {
  for (const [, tag, attrs] of html.matchAll(/<\/?([a-zA-Z0-9]+)([^>]*)>/g)) {
    assert.ok(ALLOWED.has(tag), `tag <${tag}> in ${html}`);
    const names = [...attrs.matchAll(/([a-z-]+)=/g)].map((m) => m[1]);
    assert.ok(names.every((n) => ["href", "rel", "target"].includes(n)), `${attrs} in ${html}`);
  }
}

test("formats the common markdown", () => {
  assert.equal(renderMarkdown("# Title\n\nsome **bold** and *it* and `x<y`"),
    "<h1>Title</h1><p>some <strong>bold</strong> and <em>it</em> and <code>x&lt;y</code></p>");
  assert.equal(renderMarkdown("- one\n- two\n\n1. a\n2. b"),
    "<ul><li>one</li><li>two</li></ul><ol><li>a</li><li>b</li></ol>");
  assert.equal(renderMarkdown("```js\nif (a < b) {}\n```"),
    "<pre><code>if (a &lt; b) {}</code></pre>");
  assert.equal(renderMarkdown("> quoted\nline two\nline three"),
    "<blockquote><p>quoted</p></blockquote><p>line two<br>line three</p>");
  assert.equal(renderMarkdown("[docs](https://example.org/a?b=1&c=2)"),
    '<p><a href="https://example.org/a?b=1&amp;c=2" rel="noopener noreferrer nofollow" ' +
    'target="_blank">docs</a></p>');
  assert.equal(renderMarkdown("you said 'hello'; 2*3*4 is snake_case_name"),
    "<p>you said &#39;hello&#39;; 2*3*4 is snake_case_name</p>");
});

test("no input makes markup: HTML is text, dangerous links stay text", () => {
  const attacks = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "[x](https://a.org/\"onmouseover=\"alert(1))",
    "**<b>bold</b>**",
    "`<i>code</i>`",
    "```\n</code></pre><script>x</script>\n```",
    "> <iframe src=//evil>",
    "- <a href=javascript:x>y</a>",
    "# <svg onload=alert(1)>",
    "[<img src=x>](https://ok.org)",
  ];
  for (const attack of attacks) {
    const html = renderMarkdown(attack);
    assertOnlyOwnMarkup(html);
    assert.ok(!/javascript:|data:text/i.test(html.replace(/>[^<]*</g, "><")), html);
  }
  assert.ok(!safeHref("javascript:alert(1)") && !safeHref(" vbscript:x") && !safeHref("//x.org"));
  assert.ok(safeHref("/v1/x") && safeHref("#top") && safeHref("https://x.org") &&
    safeHref("mailto:a@b.org"));
  assert.equal(escapeHtml(`<a href="x">'&'</a>`),
    "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
});
