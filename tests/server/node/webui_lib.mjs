// What the browser tests of the web page share: a headless Debian chromium driven by
// puppeteer-core, a page opened on a server with its console errors and any request
// outside the server recorded, and a message sent the way a person sends it.
import puppeteer from "puppeteer-core";

export const launch = () => puppeteer.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
});

// A new page at url/: {page, errors, outside}. allowedErrors: console errors expected
// (a 401 before the key is typed).
export async function open(browser, url, allowedErrors = []) {
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
}

// Sends a message with Enter and waits for the reply to finish; counts the times the
// reply's node was redrawn while it streamed.
export async function say(page, text) {
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
}

// The cached tokens a receipt names ("prompt 40: 32 cached · ..."), -1 if none.
export const cached = (receipt) => Number(/prompt \d+: (\d+) cached/.exec(receipt)?.[1] ?? -1);

// Sets the system prompt in the settings, as a person types it.
export async function setSystem(page, text) {
  await page.$eval("#system", (el, t) => { el.value = t; el.dispatchEvent(new Event("change")); }, text);
}
