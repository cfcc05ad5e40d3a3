// The web page at / in a real browser: Debian's chromium, headless, driven by
// puppeteer-core. usage: node webui_test.mjs BASE_URL KEYED_BASE_URL API_KEY SCREENSHOT_DIR
// - the page loads with no console error and no request outside the server;
// - typing a message and pressing Enter streams a reply (several events arrive);
// - the second message of the conversation shows cached tokens in its receipt;
// - the conversation survives a reload (this browser's storage);
// - on a server with --api-key, the page asks for the key and works with it.
// Screenshots of each state go to SCREENSHOT_DIR.
import assert from "node:assert/strict";
import puppeteer from "puppeteer-core";

const [base, keyedBase, key, shots] = process.argv.slice(2);
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});
try {
  const open = async (url, allowedErrors = []) => {
    const page = await browser.newPage();
    await page.setViewport({ width: 1100, height: 720 });
    const errors = [], outside = [];
    page.on("console", (m) => { if (m.type() === "error" && !allowedErrors.some((re) => re.test(m.text()))) errors.push(m.text()); });
    page.on("pageerror", (e) => errors.push(String(e)));
    page.on("request", (r) => { if (!r.url().startsWith(url) && !r.url().startsWith("data:")) outside.push(r.url()); });
    // Short answers: the tiny random model rarely ends on its own.
    await page.evaluateOnNewDocument(() => {
      if (!localStorage.getItem("trellis.settings")) localStorage.setItem("trellis.settings", JSON.stringify({ max_tokens: 24 }));
    });
    await page.goto(url + "/", { waitUntil: "networkidle0" });
    return { page, errors, outside };
  };
  // Sends a message with Enter and waits for the reply to finish; counts the times the
  // reply's node was redrawn while it streamed.
  const say = async (page, text) => {
    const before = await page.$$eval(".msg.assistant", (n) => n.length);
    await page.evaluate(() => {
      window.__redraws = 0;
      new MutationObserver(() => window.__redraws++).observe(document.getElementById("log"), { childList: true });
    });
    await page.type("#input", text);
    await page.keyboard.press("Enter");
    await page.waitForFunction((n) => document.body.dataset.state === "idle" && document.querySelectorAll(".msg.assistant").length === n + 1 &&
                                      document.querySelector(".msg.assistant:last-child .receipt")?.textContent,
                               { timeout: 30000 }, before);
    return page.evaluate(() => ({
      body: document.querySelector(".msg.assistant:last-child .body").textContent,
      receipt: document.querySelector(".msg.assistant:last-child .receipt").textContent,
      error: document.querySelector(".msg.assistant:last-child .error")?.textContent ?? null,
      redraws: window.__redraws,
    }));
  };
  const cached = (receipt) => Number(/prompt \d+: (\d+) cached/.exec(receipt)?.[1] ?? -1);

  // --- the open server ---
  const { page, errors, outside } = await open(base);
  assert.equal(await page.title(), "Trellis");
  await page.$eval("#system", (el) => { el.value = "You are a helpful assistant who answers every question briefly and kindly, in plain words."; el.dispatchEvent(new Event("change")); });
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
  const keyed = await open(keyedBase, [/401/]);
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
