// The web page at / in a real browser: Debian's chromium, headless, driven by
// puppeteer-core. usage: node webui_test.mjs BASE_URL KEYED_BASE_URL API_KEY SCREENSHOT_DIR
// - the page loads with no console error and no request outside the server;
// - typing a message and pressing Enter streams a reply (several events arrive);
// - the second message of the conversation shows cached tokens in its receipt;
// - the conversation survives a reload (this browser's storage);
// - on a server with --api-key, the page asks for the key and works with it.
// Screenshots of each state go to SCREENSHOT_DIR.
import assert from "node:assert/strict";
import { launch, open, say, cached, setSystem } from "./webui_lib.mjs";

const [base, keyedBase, key, shots] = process.argv.slice(2);
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };

const browser = await launch();
try {
  // --- the open server ---
  const { page, errors, outside } = await open(browser, base);
  assert.equal(await page.title(), "Trellis");
  await setSystem(page, "You are a helpful assistant who answers every question briefly and kindly, in plain words.");
  const r1 = await say(page, "Hello there, who are you?");
  assert.equal(r1.error, null, r1.error);
  assert.ok(/\d+ generated/.test(r1.receipt) && !/ 0 generated/.test(r1.receipt), r1.receipt);
  assert.ok(r1.redraws >= 3, `the reply was drawn ${r1.redraws} times: not streamed`);
  assert.ok(/TTFT \d+ ms/.test(r1.receipt), r1.receipt);
  ok(`a reply streamed (${r1.redraws} redraws): ${JSON.stringify(r1.body.slice(0, 40))}; receipt "${r1.receipt}"`);
  await page.screenshot({ path: `${shots}/webui-chat.png` });
  const r2 = await say(page, "And what can you do?");
  assert.ok(cached(r2.receipt) > 0, r2.receipt);
  ok(`the second message reused ${cached(r2.receipt)} cached tokens: "${r2.receipt}"`);
  await page.screenshot({ path: `${shots}/webui-second.png` });
  // Model output is untrusted: raw HTML is text, links only http(s), images never fetched.
  const html = await page.evaluate(() => md('<img src=x onerror="alert(1)"> **bold** [a](javascript:alert(1)) ' +
                                            '[b](https://example.org/) ![c](http://example.org/c.png)\n\n```\ncode\n```'));
  assert.ok(!/<img|<script|javascript:/i.test(html), html);
  assert.ok(html.includes("&lt;img") && html.includes("<strong>bold</strong>") && html.includes('href="https://example.org/"') &&
            html.includes("<pre><code>"), html);
  ok("Markdown: raw HTML shown as text, javascript: links and images dropped, code blocks kept");
  // The cache view: the conversation's prefix, held by no session now, hit by the second turn.
  await page.click("#show-cache");
  await page.waitForFunction(() => document.querySelectorAll("#cache-tree rect").length >= 1 &&
                                    document.getElementById("cache-summary").textContent.includes("blocks"), { timeout: 10000 });
  const view = await page.evaluate(() => ({
    summary: document.getElementById("cache-summary").textContent,
    rects: [...document.querySelectorAll("#cache-tree rect")].map((r) => ({ hits: Number(r.dataset.hits), mine: r.dataset.mine === "true" })),
    titles: [...document.querySelectorAll("#cache-tree title")].map((t) => t.textContent),
  }));
  assert.ok(view.rects.every((r) => r.mine), JSON.stringify(view.rects));  // one tenant: every prefix is the viewer's
  assert.ok(view.rects.some((r) => r.hits >= 1), JSON.stringify(view.rects));
  assert.ok(view.titles.some((t) => t.includes("helpful assistant")), view.titles.join(" | "));
  ok(`cache view: ${view.rects.length} node(s), the system prompt's text shown to its owner; "${view.summary.slice(0, 90)}..."`);
  await page.screenshot({ path: `${shots}/webui-cache.png` });
  // The grid section (a `serve --grid` head's view; serve_grid.sh checks the endpoint's
  // fields on a real grid): drawn from the documented shape, a node down and one failure.
  const grid = await page.evaluate(() => {
    const node = (address, layers, up, steps, seconds, failures) =>
      ({ address, layers, up, steps, step_seconds: seconds, failures, rtt_seconds: 0.0002, bandwidth: 2.5e9 });
    drawGrid({ healthy: false, message: "grid node 127.0.0.1:7003 (layers 3-3) failed: timed out",
               head: { layers: null, layers_seconds: 0, wait_seconds: 1.5, logits_seconds: 0.2 }, steps: 40, tokens: 900,
               node_failures: 1, rejoins: 0,
               nodes: [node("127.0.0.1:7001", [0, 1], true, 40, 0.4, 0), node("127.0.0.1:7003", [3, 3], false, 39, 0.3, 1)] });
    return { summary: document.getElementById("grid-summary").textContent,
             rows: [...document.querySelectorAll("#grid-nodes tr")].slice(1).map((r) => ({ down: r.className === "down",
                                                                                            cells: [...r.cells].map((c) => c.textContent) })) };
  });
  assert.ok(grid.summary.includes("not serving: grid node 127.0.0.1:7003"), grid.summary);
  assert.deepEqual(grid.rows.map((r) => [r.cells[0], r.cells[1], r.cells[2], r.cells[4], r.cells[5], r.down]),
                   [["127.0.0.1:7001", "0-1", "up", "mean 10.0 ms", "0", false], ["127.0.0.1:7003", "3-3", "down", "mean 7.7 ms", "1", true]]);
  ok(`grid section: ${grid.rows.map((r) => r.cells.slice(0, 3).join(" ")).join("; ")}`);
  await page.click("#show-chat");
  await page.reload({ waitUntil: "networkidle0" });
  const kept = await page.$$eval(".msg", (n) => n.length);
  assert.equal(kept, 4, "the conversation was not kept across a reload");
  ok("the conversation is kept across a reload (localStorage)");
  assert.deepEqual(errors, [], `console errors: ${errors.join(" | ")}`);
  assert.deepEqual(outside, [], `requests outside the server: ${outside.join(" ")}`);
  ok("no console error, no request outside the server");
  await page.close();

  // --- a server with an API key: the page asks for it ---
  const keyed = await open(browser, keyedBase, [/401/]);
  await keyed.page.type("#input", "Hello?");
  await keyed.page.keyboard.press("Enter");
  await keyed.page.waitForSelector("#keydlg.open", { timeout: 10000 });
  await keyed.page.screenshot({ path: `${shots}/webui-key.png` });
  await keyed.page.type("#keyinput", key);
  await keyed.page.click("#keyok");
  await keyed.page.waitForFunction(() => document.body.dataset.state === "idle" &&
                                         document.querySelector(".msg.assistant:last-child .receipt")?.textContent, { timeout: 30000 });
  const rk = await keyed.page.evaluate(() => ({
    receipt: document.querySelector(".msg.assistant:last-child .receipt").textContent,
    error: document.querySelector(".msg.assistant:last-child .error")?.textContent ?? null,
  }));
  assert.equal(rk.error, null, rk.error);
  assert.ok(/\d+ generated/.test(rk.receipt), rk.receipt);
  assert.deepEqual(keyed.errors, [], `console errors: ${keyed.errors.join(" | ")}`);
  assert.deepEqual(keyed.outside, [], `requests outside the server: ${keyed.outside.join(" ")}`);
  ok(`with --api-key the page asked for the key and answered: "${rk.receipt}"`);
} finally {
  await browser.close();
}
console.log(`PASS webui_test.mjs: ${checks} checks`);
