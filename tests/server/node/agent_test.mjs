// Structured output and tool calls through the official openai npm client and zod,
// unchanged: zodResponseFormat with beta.chat.completions.parse (the answer parsed and
// checked by the client's own zod schema), a tool loop with zodFunction (a forced call,
// its parsed_arguments, the result sent back, the next turn), and a streamed call
// assembled by the client's stream helper. A random model writes none of this by itself.
// usage: node agent_test.mjs BASE_URL API_KEY MODEL
import assert from "node:assert/strict";
import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };
const random = (seed, temperature) => ({ seed, temperature, top_k: 0, top_p: 1, min_p: 0 });

// zodResponseFormat: the client sends the schema (strict) and parses the answer with zod.
const Order = z.object({
  customer: z.string().max(16),
  items: z.array(z.object({ sku: z.string().uuid(), qty: z.number().int(), kind: z.enum(["book", "tool"]) })).max(3),
  paid: z.boolean(),
  note: z.string().max(12).nullable(),
});
for (const [seed, temp] of [[1, 0], [2, 0.8], [3, 1.2]]) {
  const r = await client.beta.chat.completions.parse({
    model, messages: [{ role: "user", content: "Give me an order." }], max_tokens: 500,
    response_format: zodResponseFormat(Order, "order"), ...random(seed, temp),
  });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, "stop", JSON.stringify(r.choices[0]));
  assert.ok(m.parsed, m.content);
  assert.ok(Order.safeParse(m.parsed).success, m.content);
}
ok("zodResponseFormat + parse: 3 answers, each parsed and valid by the client's zod schema");

// A tool loop with zodFunction: a forced call, parsed by the client; the result goes back.
const Weather = z.object({ city: z.string().max(20), unit: z.enum(["celsius", "fahrenheit"]) });
const tools = [zodFunction({ name: "get_weather", parameters: Weather, description: "Weather now in a city." })];
const messages = [{ role: "system", content: "You call tools. ".repeat(30) },
                  { role: "user", content: "Weather in Oslo?" }];
const t1 = await client.beta.chat.completions.parse({
  model, messages, tools, tool_choice: "required", parallel_tool_calls: false, max_tokens: 300, ...random(5, 0.7),
});
const call = t1.choices[0].message.tool_calls?.[0];
assert.equal(t1.choices[0].finish_reason, "tool_calls", JSON.stringify(t1.choices[0]));
assert.equal(t1.choices[0].message.tool_calls.length, 1);
assert.equal(call.function.name, "get_weather");
assert.ok(Weather.safeParse(call.function.parsed_arguments).success, call.function.arguments);
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
messages.push(t1.choices[0].message, { role: "tool", tool_call_id: call.id, content: JSON.stringify({ temp: -3 }) });
const t2 = await client.chat.completions.create({ model, messages, tools, tool_choice: "none", max_tokens: 6, ...random(5, 0.7) });
assert.ok(!t2.choices[0].message.tool_calls, JSON.stringify(t2.choices[0].message));
assert.ok(t2.usage.prompt_tokens_details.cached_tokens >= t1.usage.prompt_tokens / 2, JSON.stringify(t2.usage));
ok(`tool loop: ${call.function.name}(${call.function.arguments}), result back, turn 2 reused ` +
   `${t2.usage.prompt_tokens_details.cached_tokens} of ${t2.usage.prompt_tokens} prompt tokens`);

// A streamed forced call, assembled by the client's stream helper.
const stream = client.beta.chat.completions.stream({
  model, messages: messages.slice(0, 2), tools, tool_choice: { type: "function", function: { name: "get_weather" } },
  max_tokens: 300, ...random(9, 1.0),
});
const final = await stream.finalChatCompletion();
const sc = final.choices[0].message.tool_calls?.[0];
assert.equal(final.choices[0].finish_reason, "tool_calls", JSON.stringify(final.choices[0]));
assert.equal(sc.function.name, "get_weather");
assert.ok(Weather.safeParse(JSON.parse(sc.function.arguments)).success, sc.function.arguments);
ok(`streamed call assembled by the client: ${sc.function.arguments}`);

console.log(`PASS agent_test.mjs: ${checks} checks`);
