// Drives `trellis serve` with the official openai npm client: chat and completions,
// streamed and not, usage with cached tokens, an API key, and an error surfaced as the
// client's typed exception. usage: node client_test.mjs BASE_URL API_KEY MODEL
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 30000 });
const system = "You are a concise assistant. Answer in one short sentence and never repeat the question.";
const messages = (q) => [{ role: "system", content: system }, { role: "user", content: q }];
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };

// Non-streamed chat, twice: the second call reuses the cached system prompt.
const c1 = await client.chat.completions.create({ model, messages: messages("Hello?"), max_tokens: 8 });
assert.equal(c1.object, "chat.completion");
assert.equal(c1.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(c1.choices[0].finish_reason));
assert.equal(c1.usage.prompt_tokens_details.cached_tokens, 0);
assert.equal(c1.usage.total_tokens, c1.usage.prompt_tokens + c1.usage.completion_tokens);
const c2 = await client.chat.completions.create({ model, messages: messages("Hi again?"), max_tokens: 8, temperature: 0 });
assert.ok(c2.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(c2.usage));
ok(`chat: ${JSON.stringify(c1.choices[0].message.content)}; cached ${c1.usage.prompt_tokens_details.cached_tokens} then ${c2.usage.prompt_tokens_details.cached_tokens}`);

// Streamed chat with include_usage.
const stream = await client.chat.completions.create({
  model, messages: messages("Stream it."), max_tokens: 6, stream: true, stream_options: { include_usage: true },
});
let text = "", role = null, finish = null, usage = null, n = 0;
for await (const chunk of stream) {
  n++;
  if (chunk.usage) usage = chunk.usage;
  const ch = chunk.choices[0];
  if (!ch) continue;
  if (ch.delta.role) role = ch.delta.role;
  if (ch.delta.content) text += ch.delta.content;
  if (ch.finish_reason) finish = ch.finish_reason;
}
assert.equal(role, "assistant");
assert.ok(["stop", "length"].includes(finish));
assert.ok(usage && usage.completion_tokens <= 6 && usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(usage));
ok(`chat stream: ${n} chunks, ${JSON.stringify(text)}, usage ${JSON.stringify(usage)}`);

// Completions, non-streamed and streamed (greedy: same text both ways).
const p = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
assert.equal(p.object, "text_completion");
assert.equal(p.usage.completion_tokens, 5);
assert.equal(p.choices[0].finish_reason, "length");
const ps = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0, stream: true });
let stext = "";
for await (const chunk of ps) stext += chunk.choices[0]?.text ?? "";
assert.equal(stext, p.choices[0].text);
ok(`completions: ${JSON.stringify(p.choices[0].text)} both ways`);

// Logprobs through the client's types.
const lp = await client.chat.completions.create({ model, messages: messages("x"), max_tokens: 2, logprobs: true, top_logprobs: 2 });
assert.equal(lp.choices[0].logprobs.content.length, 2);
assert.equal(lp.choices[0].logprobs.content[0].top_logprobs.length, 2);
ok("logprobs");

// Models list.
const models = await client.models.list();
assert.equal(models.data[0].id, model);
ok(`models: ${models.data.map((m) => m.id).join(",")}`);

// Errors come back as the client's typed exceptions.
await assert.rejects(client.chat.completions.create({ model, messages: messages("x"), temperature: 9 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature");
await assert.rejects(client.chat.completions.create({ model: "gpt-4o", messages: messages("x") }),
  (e) => e instanceof OpenAI.NotFoundError);
const wrong = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "not-the-key", maxRetries: 0 });
await assert.rejects(wrong.chat.completions.create({ model, messages: messages("x") }),
  (e) => e instanceof OpenAI.AuthenticationError);
ok("400 BadRequestError, 404 NotFoundError, 401 AuthenticationError");

console.log(`PASS openai npm client: ${checks} checks`);
