// The web page on a store-backed pair (two `trellis serve --store` engines, one store
// server each), in headless Chromium. usage: node webui_store_test.mjs BASE1 BASE2 SHOTS
// - a conversation on node 1 is computed there and published to the store;
// - the same conversation started on node 2, whose own cache is empty, shows in its
//   receipt the tokens it read from the store, by tier;
// - node 2's cache view shows the store: both servers up with the bytes they hold, and
//   the blocks this engine fetched;
// - no console error, no request outside the server. Screenshot: SHOTS/webui-store.png.
import assert from "node:assert/strict";
import { launch, open, say, setSystem } from "./webui_lib.mjs";

const [base1, base2, shots] = process.argv.slice(2);
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };
const system = "You are the harbour master's assistant. You answer questions about tides, moorings, " +
  "pilotage, the fees for each class of vessel and the rules of the inner basin, briefly and exactly.";
const question = "When may a ship of forty metres enter the inner basin?";

const browser = await launch();
try {
  const one = await open(browser, base1);
  await setSystem(one.page, system);
  const r1 = await say(one.page, question);
  assert.equal(r1.error, null, r1.error);
  assert.ok(!/store [1-9]/.test(r1.receipt), r1.receipt);
  // Publishing runs after the answer: wait until node 1 has published its blocks.
  let published = 0;
  for (let i = 0; i < 100 && published === 0; i++) {
    const v = await (await fetch(`${base1}/trellis/v1/cache`)).json();
    published = v.store.engine.published_blocks;
    if (!published) await new Promise((r) => setTimeout(r, 100));
  }
  assert.ok(published > 0, "node 1 published nothing");
  ok(`node 1 computed the conversation ("${r1.receipt}") and published ${published} blocks`);

  const two = await open(browser, base2);
  await setSystem(two.page, system);
  const r2 = await say(two.page, question);
  assert.equal(r2.error, null, r2.error);
  const m = /store (\d+) \(memory (\d+), replica (\d+), ssd (\d+), remote (\d+)\)/.exec(r2.receipt);
  assert.ok(m && Number(m[1]) > 0, `node 2's receipt names no store tokens: ${r2.receipt}`);
  assert.equal(Number(m[1]), Number(m[2]) + Number(m[3]) + Number(m[4]) + Number(m[5]), r2.receipt);
  assert.ok(/local 0 /.test(r2.receipt), r2.receipt);
  ok(`node 2 read ${m[1]} tokens from the store: "${r2.receipt}"`);

  await two.page.click("#show-cache");
  await two.page.waitForFunction(() => document.querySelectorAll("#store-servers tr").length >= 3 &&
                                       document.getElementById("store-engine").textContent.includes("fetched"), { timeout: 10000 });
  const view = await two.page.evaluate(() => ({
    engine: document.getElementById("store-engine").textContent,
    rows: [...document.querySelectorAll("#store-servers tr")].slice(1).map((r) => ({
      down: r.className === "down", cells: [...r.cells].map((c) => c.textContent) })),
  }));
  assert.equal(view.rows.length, 2, JSON.stringify(view.rows));
  assert.ok(view.rows.every((r) => !r.down), JSON.stringify(view.rows));
  const j = await (await fetch(`${base2}/trellis/v1/cache`)).json();
  assert.ok(j.store.servers.reduce((a, s) => a + s.memory.used, 0) > 0, JSON.stringify(j.store));
  const f = j.store.engine.blocks_from;  // this engine's fetches, by tier: the receipt's blocks
  assert.equal(f.memory + f.replica + f.ssd + f.remote, j.store.engine.fetched_blocks, JSON.stringify(j.store.engine));
  assert.equal(32 * j.store.engine.fetched_blocks, Number(m[1]), `${JSON.stringify(j.store.engine)} vs ${r2.receipt}`);
  assert.ok(j.store.servers.every((s) => view.rows.some((r) => r.cells[0] === s.address)), JSON.stringify(view.rows));
  assert.ok(/[1-9]\d* blocks fetched/.test(view.engine), view.engine);
  ok(`node 2's cache view: ${view.rows.map((r) => `${r.cells[0]} ${r.cells[1]}`).join("; ")}; "${view.engine.slice(0, 100)}..."`);
  await two.page.screenshot({ path: `${shots}/webui-store.png`, fullPage: true });
  for (const p of [one, two]) {
    assert.deepEqual(p.errors, [], `console errors: ${p.errors.join(" | ")}`);
    assert.deepEqual(p.outside, [], `requests outside the server: ${p.outside.join(" ")}`);
  }
  ok("no console error, no request outside either server");
} finally {
  await browser.close();
}
console.log(`PASS webui_store_test.mjs: ${checks} checks`);
