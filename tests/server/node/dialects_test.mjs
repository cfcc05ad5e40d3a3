// Drives `trellis serve`'s other dialects with their own npm clients, unchanged: the
// Anthropic SDK (Messages: plain, cached, streamed raw and with the stream helper, a forced
// tool and its result, stop sequences, token counting, typed errors), the ollama client
// (list, show, version, chat and generate streamed and not, a JSON schema format, tools,
// errors) and the openai client's Responses API (plain, cached, streamed, a function call
// continued with previous_response_id, a json_schema format, a refused built-in tool).
// The model has random weights: the checks are on structure, and greedy runs (temperature
// 0) must give the same text streamed and not. usage: node dialects_test.mjs BASE_URL API_KEY MODEL
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { Ollama } from "ollama";
import OpenAI from "openai";

const [baseURL, apiKey, model] = process.argv.slice(2);
if (!model) {
  console.error("usage: node dialects_test.mjs BASE_URL API_KEY MODEL");
  process.exit(2);
}
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };
const show = (x) => JSON.stringify(x);

// Long enough (~70 words) to span several 32-token KV blocks: a second request with it reads
// them from the prefix cache.
const SYSTEM = "You are a concise assistant for a small weather service. Answer every question in one " +
  "short sentence, never repeat the question, never apologise, and never mention that you are a " +
  "language model. When the user asks about the weather in a city, call the weather tool with the " +
  "city's name instead of guessing. When a tool result arrives, state it plainly and add nothing. " +
  "Use metric units, spell out numbers below ten, and keep every answer under twenty words.";
// Bounded strings and no extra keys: a random model under a grammar still ends the object.
const citySchema = {
  type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"], additionalProperties: false,
};
const answerSchema = {
  type: "object", properties: { answer: { type: "string", maxLength: 24 } }, required: ["answer"], additionalProperties: false,
};
const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);

// ---------------------------------------------------------------- Anthropic Messages API
const anthropic = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const ask = (q) => [{ role: "user", content: q }];
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
const stopReasons = ["end_turn", "max_tokens"];

// Plain, twice with the same system prompt: the second reads it from the cache.
const a1 = await anthropic.messages.create({ model, system: SYSTEM, messages: ask("Hello?"), max_tokens: 8 });
assert.equal(a1.type, "message", show(a1));
assert.equal(a1.role, "assistant");
assert.equal(typeof a1.id, "string");
assert.equal(a1.content[0]?.type, "text", show(a1));
assert.ok(stopReasons.includes(a1.stop_reason), show(a1));
assert.ok(a1.usage.input_tokens > 0 && a1.usage.output_tokens <= 8, show(a1.usage));
const a2 = await anthropic.messages.create({ model, system: SYSTEM, messages: ask("What is the capital of Norway?"), max_tokens: 8 });
assert.equal(a2.type, "message");
assert.ok(a2.usage.cache_read_input_tokens > 0, show(a2.usage));
assert.ok(a2.usage.input_tokens > 0, show(a2.usage));
ok(`anthropic messages: ${show(textOf(a1))} (${a1.stop_reason}); cache read ${a1.usage.cache_read_input_tokens ?? 0} ` +
   `then ${a2.usage.cache_read_input_tokens} (+${a2.usage.input_tokens} uncached)`);

// Streamed, raw events, against the same greedy request not streamed.
const greedy = { model, system: SYSTEM, messages: ask("Tell me a story."), max_tokens: 8, temperature: 0 };
const g = await anthropic.messages.create(greedy);
assert.ok(stopReasons.includes(g.stop_reason), show(g));
const events = [];
for await (const ev of await anthropic.messages.create({ ...greedy, stream: true })) events.push(ev);
const types = events.map((e) => e.type);
assert.equal(types[0], "message_start", show(types));
assert.equal(types.at(-1), "message_stop", show(types));
assert.equal(types.at(-2), "message_delta", show(types));
assert.equal(types.filter((t) => t === "message_start" || t === "message_delta" || t === "message_stop").length, 3, show(types));
const started = events[0].message;
assert.equal(started.role, "assistant");
assert.deepEqual(started.content, []);
assert.ok(started.usage.input_tokens + (started.usage.cache_read_input_tokens ?? 0) > 0, show(started.usage));
let open = null, blocks = 0, streamed = "";
for (const ev of events.slice(1, -2)) {
  if (ev.type === "content_block_start") {
    assert.equal(open, null, show(types));
    assert.equal(ev.index, blocks);
    assert.equal(ev.content_block.type, "text", show(ev));
    open = ev.index;
    blocks++;
  } else if (ev.type === "content_block_delta") {
    assert.equal(ev.index, open, show(ev));
    assert.equal(ev.delta.type, "text_delta", show(ev));
    streamed += ev.delta.text;
  } else if (ev.type === "content_block_stop") {
    assert.equal(ev.index, open, show(ev));
    open = null;
  } else {
    assert.fail(`unexpected event ${show(ev)}`);
  }
}
assert.equal(open, null);
assert.ok(blocks >= 1, show(types));
const mdelta = events.at(-2);
assert.equal(mdelta.delta.stop_reason, g.stop_reason, show(mdelta));
assert.equal(mdelta.usage.output_tokens, g.usage.output_tokens, show(mdelta));
assert.equal(streamed, textOf(g));
// The SDK's stream helper assembles the same message.
const helper = anthropic.messages.stream(greedy);
let helperDeltas = "";
helper.on("text", (delta) => { helperDeltas += delta; });
const final = await helper.finalMessage();
assert.equal(textOf(final), textOf(g));
assert.equal(helperDeltas, textOf(g));
assert.equal(final.stop_reason, g.stop_reason);
assert.equal(final.usage.output_tokens, g.usage.output_tokens);
ok(`anthropic stream: ${events.length} events (${[...new Set(types)].join(",")}), ${show(streamed)}; ` +
   `messages.stream().finalMessage() the same`);

// A forced tool, its result sent back, and the same call streamed.
const weather = { name: "get_weather", description: "The weather now in a city.", input_schema: citySchema };
const toolAsk = ask("What is the weather in Oslo?");
const forced = {
  model, system: SYSTEM, messages: toolAsk, tools: [weather], tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
  max_tokens: 200, temperature: 0,
};
const t1 = await anthropic.messages.create(forced);
assert.equal(t1.stop_reason, "tool_use", show(t1));
const use = t1.content.find((b) => b.type === "tool_use");
assert.ok(use, show(t1.content));
assert.equal(typeof use.id, "string");
assert.ok(use.id.length > 0);
assert.equal(use.name, "get_weather");
assert.ok(isObject(use.input) && typeof use.input.city === "string", show(use));
const t2 = await anthropic.messages.create({
  model, system: SYSTEM, tools: [weather], max_tokens: 8, temperature: 0,
  messages: [...toolAsk, { role: "assistant", content: t1.content },
             { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "12 degrees" }] }],
});
assert.equal(t2.type, "message", show(t2));
assert.ok(stopReasons.includes(t2.stop_reason), show(t2));
assert.ok(t2.content.every((b) => b.type === "text"), show(t2.content));
assert.ok(t2.usage.cache_read_input_tokens > 0, show(t2.usage));
let toolStart = null, partial = "", toolStop = null;
for await (const ev of await anthropic.messages.create({ ...forced, stream: true })) {
  if (ev.type === "content_block_start" && ev.content_block.type === "tool_use") toolStart = ev.content_block;
  if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") partial += ev.delta.partial_json;
  if (ev.type === "message_delta") toolStop = ev.delta.stop_reason;
}
assert.ok(toolStart, "no tool_use content_block_start");
assert.equal(toolStart.name, "get_weather");
assert.equal(typeof toolStart.id, "string");
assert.equal(toolStop, "tool_use");
const streamedInput = JSON.parse(partial);
assert.ok(isObject(streamedInput) && typeof streamedInput.city === "string", partial);
assert.deepEqual(streamedInput, use.input);
ok(`anthropic tool_use: get_weather(${show(use.input)}) id ${use.id}, tool_result back -> ` +
   `${show(textOf(t2))} (cache read ${t2.usage.cache_read_input_tokens}); streamed input_json_delta ${show(partial)}`);

// Stop sequences: never in the text; a stop names the one that matched.
const stops = ["\n", "e"];
const s = await anthropic.messages.create({ ...greedy, messages: ask("Write one line."), stop_sequences: stops });
assert.ok([...stopReasons, "stop_sequence"].includes(s.stop_reason), show(s));
if (s.stop_reason === "stop_sequence") assert.ok(stops.includes(s.stop_sequence), show(s));
else assert.equal(s.stop_sequence ?? null, null, show(s));
for (const x of stops) assert.ok(!textOf(s).includes(x), show(s));
ok(`anthropic stop_sequences: ${show(textOf(s))} ${s.stop_reason} ${show(s.stop_sequence)}`);

// Token counting: the prompt of a1, all of it (uncached + read + written).
const count = await anthropic.messages.countTokens({ model, system: SYSTEM, messages: ask("Hello?") });
const u = a1.usage;
assert.ok(count.input_tokens > 0, show(count));
assert.equal(count.input_tokens, u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0),
             `${show(count)} vs ${show(u)}`);
ok(`anthropic count_tokens: ${count.input_tokens}`);

// Errors as the SDK's typed exceptions; the key also in Anthropic's own header, x-api-key.
await assert.rejects(anthropic.messages.create({ model, messages: ask("x"), max_tokens: 4, temperature: 5 }),
  (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.type === "invalid_request_error" &&
         e.error?.type === "error");
const wrongA = new Anthropic({ baseURL, apiKey: "not-the-key", maxRetries: 0, timeout: 30000 });
await assert.rejects(wrongA.messages.create({ model, messages: ask("x"), max_tokens: 4 }),
  (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
const viaHeader = (key) => new Anthropic({ baseURL, apiKey: null, defaultHeaders: { "x-api-key": key }, maxRetries: 0, timeout: 30000 });
const counted = await viaHeader(apiKey).messages.countTokens({ model, system: SYSTEM, messages: ask("Hello?") });
assert.equal(counted.input_tokens, count.input_tokens);
await assert.rejects(viaHeader("not-the-key").messages.countTokens({ model, messages: ask("x") }),
  (e) => e instanceof Anthropic.AuthenticationError && e.status === 401);
ok("anthropic 400 BadRequestError, 401 AuthenticationError (Bearer and x-api-key), x-api-key accepted");

// ---------------------------------------------------------------- Ollama API
const ollama = new Ollama({ host: baseURL, headers: { Authorization: `Bearer ${apiKey}` } });

const tags = await ollama.list();
const entry = tags.models.find((m) => m.name === model || m.name === `${model}:latest`);
assert.ok(entry, show(tags));
assert.equal(entry.details?.format, "gguf", show(entry));
const info = await ollama.show({ model });
assert.ok(isObject(info.model_info), show(info));
const arch = info.model_info["general.architecture"];
assert.equal(typeof arch, "string", show(info.model_info));
assert.ok(info.model_info[`${arch}.context_length`] > 0, show(info.model_info));
assert.ok(Array.isArray(info.capabilities) && info.capabilities.includes("completion"), show(info.capabilities));
assert.equal(typeof info.template, "string");
const ver = await ollama.version();
assert.ok(typeof ver.version === "string" && ver.version.length > 0, show(ver));
ok(`ollama list ${entry.name}, show (${arch}, ${info.model_info[`${arch}.context_length`]} ctx, ` +
   `capabilities ${info.capabilities}), version ${ver.version}`);

// Chat, not streamed and streamed (greedy: the same text).
const chatReq = {
  model, messages: [{ role: "system", content: SYSTEM }, { role: "user", content: "Good morning?" }],
  options: { num_predict: 8, temperature: 0 },
};
const oc = await ollama.chat({ ...chatReq, stream: false });
assert.equal(oc.message.role, "assistant", show(oc));
assert.equal(typeof oc.message.content, "string");
assert.equal(oc.done, true);
assert.ok(["stop", "length"].includes(oc.done_reason), show(oc));
assert.ok(oc.eval_count <= 8 && oc.prompt_eval_count > 0, show(oc));
const parts = [];
for await (const part of await ollama.chat({ ...chatReq, stream: true })) parts.push(part);
assert.ok(parts.length >= 2, show(parts));
assert.ok(parts.slice(0, -1).every((p) => p.done === false && p.message.role === "assistant"), show(parts));
const lastPart = parts.at(-1);
assert.equal(lastPart.done, true);
assert.equal(lastPart.done_reason, oc.done_reason, show(lastPart));
assert.equal(lastPart.eval_count, oc.eval_count, show(lastPart));
assert.equal(parts.map((p) => p.message.content).join(""), oc.message.content);
ok(`ollama chat: ${show(oc.message.content)} (${oc.done_reason}, ${oc.prompt_eval_count}+${oc.eval_count} tokens); ` +
   `streamed in ${parts.length} parts, the same`);

// Generate, not streamed and streamed.
const genReq = { model, prompt: "Once upon a time", options: { num_predict: 6, temperature: 0 } };
const og = await ollama.generate({ ...genReq, stream: false });
assert.equal(typeof og.response, "string", show(og));
assert.equal(og.done, true);
assert.ok(["stop", "length"].includes(og.done_reason), show(og));
assert.ok(og.eval_count <= 6, show(og));
let generated = "", genDone = null;
for await (const part of await ollama.generate({ ...genReq, stream: true })) {
  generated += part.response;
  if (part.done) genDone = part;
}
assert.ok(genDone, "no done part");
assert.equal(generated, og.response);
ok(`ollama generate: ${show(og.response)} both ways`);

// A JSON schema as format.
const of = await ollama.chat({
  model, messages: [{ role: "user", content: "Answer in JSON." }], format: answerSchema,
  options: { num_predict: 200, temperature: 0 },
});
assert.ok(["stop", "length"].includes(of.done_reason), show(of));
if (of.done_reason === "stop") assert.equal(typeof JSON.parse(of.message.content).answer, "string", of.message.content);
ok(`ollama format schema: ${of.message.content} (${of.done_reason})`);

// Tools: a random model may not call, so the shape is checked when it does; a call and its
// result sent back in Ollama's own form (arguments an object, a tool message with tool_name).
const otools = [{ type: "function", function: { name: "get_weather", description: "The weather now in a city.", parameters: citySchema } }];
const ot = await ollama.chat({
  model, messages: [{ role: "user", content: "What is the weather in Oslo?" }], tools: otools,
  options: { num_predict: 8, temperature: 0 },
});
assert.equal(ot.done, true);
assert.equal(ot.message.role, "assistant", show(ot));
for (const call of ot.message.tool_calls ?? []) {
  assert.equal(typeof call.function.name, "string", show(call));
  assert.ok(isObject(call.function.arguments), show(call));
}
const ot2 = await ollama.chat({
  model, tools: otools, options: { num_predict: 4, temperature: 0 },
  messages: [{ role: "user", content: "What is the weather in Oslo?" },
             { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: { city: "Oslo" } } }] },
             { role: "tool", content: "12 degrees", tool_name: "get_weather" }],
});
assert.equal(ot2.done, true);
assert.equal(ot2.message.role, "assistant", show(ot2));
ok(`ollama tools: ${ot.message.tool_calls ? show(ot.message.tool_calls) : `no call (${show(ot.message.content)})`}; ` +
   `a call and its tool result sent back -> ${show(ot2.message.content)}`);

// Errors: the client's ResponseError with the status and the body's error string.
await assert.rejects(ollama.chat({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
  (e) => e.name === "ResponseError" && e.status_code === 404 && typeof e.error === "string" && e.error.length > 0);
await assert.rejects(new Ollama({ host: baseURL, headers: { Authorization: "Bearer not-the-key" } }).list(),
  (e) => e.name === "ResponseError" && e.status_code === 401);
ok("ollama 404 for an unknown model, 401 for a wrong key");

// ---------------------------------------------------------------- OpenAI Responses API
const openai = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 30000 });
assert.equal(typeof openai.responses?.create, "function", "this openai client has no responses API");
const outText = (r) => r.output.filter((i) => i.type === "message")
  .flatMap((i) => i.content).filter((c) => c.type === "output_text").map((c) => c.text).join("");
const checkResponse = (r, max) => {
  assert.equal(r.object, "response", show(r));
  assert.equal(typeof r.id, "string");
  assert.ok(["completed", "incomplete"].includes(r.status), show(r));
  if (r.status === "incomplete") assert.equal(r.incomplete_details?.reason, "max_output_tokens", show(r));
  assert.equal(typeof r.output_text, "string");
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens <= max, show(r.usage));
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens, show(r.usage));
  assert.ok(r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens, show(r.usage));
};

// Plain, twice with the same instructions: the second reads them from the cache.
const r1 = await openai.responses.create({ model, instructions: SYSTEM, input: "Hello?", max_output_tokens: 8 });
checkResponse(r1, 8);
assert.equal(r1.output[0]?.type, "message", show(r1.output));
assert.equal(r1.output[0].role, "assistant");
assert.ok(r1.output[0].content.every((c) => c.type === "output_text"), show(r1.output));
const r2 = await openai.responses.create({ model, instructions: SYSTEM, input: "Hi again?", max_output_tokens: 8 });
checkResponse(r2, 8);
assert.ok(r2.usage.input_tokens_details.cached_tokens > 0, show(r2.usage));
ok(`responses: ${show(r1.output_text)} (${r1.status}); cached ${r1.usage.input_tokens_details.cached_tokens} ` +
   `then ${r2.usage.input_tokens_details.cached_tokens} of ${r2.usage.input_tokens}`);

// Streamed events against the same greedy request not streamed, and the client's stream helper.
const greedyR = { model, instructions: SYSTEM, input: "Tell me a story.", max_output_tokens: 6, temperature: 0 };
const rg = await openai.responses.create(greedyR);
checkResponse(rg, 6);
const revs = [];
for await (const ev of await openai.responses.create({ ...greedyR, stream: true })) revs.push(ev);
assert.equal(revs[0].type, "response.created", show(revs[0]));
assert.equal(revs[0].response.status, "in_progress", show(revs[0]));
const rlast = revs.at(-1);
// A response cut by max_output_tokens ends with response.incomplete, as OpenAI's does.
assert.equal(rlast.type, rg.status === "completed" ? "response.completed" : "response.incomplete", show(rlast));
assert.equal(rlast.response.status, rg.status);
assert.equal(rlast.response.usage?.output_tokens, rg.usage.output_tokens, show(rlast.response.usage));
const rdeltas = revs.filter((e) => e.type === "response.output_text.delta");
assert.ok(rdeltas.length > 0, show(revs.map((e) => e.type)));
assert.equal(rdeltas.map((e) => e.delta).join(""), rg.output_text);
assert.equal(outText(rlast.response), rg.output_text);
const rfinal = await openai.responses.stream(greedyR).finalResponse();
assert.equal(outText(rfinal), rg.output_text);
ok(`responses stream: ${revs.length} events (${[...new Set(revs.map((e) => e.type))].join(",")}), ` +
   `${show(rg.output_text)}; responses.stream() the same`);

// A function call, then its output with previous_response_id (the earlier turn is cached).
const fnTool = { type: "function", name: "get_weather", description: "The weather now in a city.", parameters: citySchema, strict: true };
const f1 = await openai.responses.create({
  model, instructions: SYSTEM, input: "What is the weather in Oslo?", tools: [fnTool], tool_choice: "required",
  parallel_tool_calls: false, max_output_tokens: 200, temperature: 0,
});
assert.equal(f1.status, "completed", show(f1));
const fc = f1.output.find((i) => i.type === "function_call");
assert.ok(fc, show(f1.output));
assert.equal(fc.name, "get_weather");
assert.ok(typeof fc.call_id === "string" && fc.call_id.length > 0, show(fc));
assert.equal(typeof fc.arguments, "string");
const fargs = JSON.parse(fc.arguments);
assert.ok(isObject(fargs) && typeof fargs.city === "string", fc.arguments);
const f2 = await openai.responses.create({
  model, instructions: SYSTEM, previous_response_id: f1.id, tools: [fnTool], max_output_tokens: 8, temperature: 0,
  input: [{ type: "function_call_output", call_id: fc.call_id, output: "12 degrees" }],
});
checkResponse(f2, 8);
assert.equal(f2.previous_response_id, f1.id);
assert.equal(f2.output[0]?.type, "message", show(f2.output));
assert.ok(f2.usage.input_tokens_details.cached_tokens > 0, show(f2.usage));
ok(`responses function_call: get_weather(${fc.arguments}) ${fc.call_id}; its output via previous_response_id -> ` +
   `${show(f2.output_text)} (cached ${f2.usage.input_tokens_details.cached_tokens} of ${f2.usage.input_tokens})`);

// text.format json_schema.
const rj = await openai.responses.create({
  model, input: "Answer in JSON.", max_output_tokens: 200, temperature: 0,
  text: { format: { type: "json_schema", name: "answer", schema: answerSchema, strict: true } },
});
checkResponse(rj, 200);
if (rj.status === "completed") assert.equal(typeof JSON.parse(rj.output_text).answer, "string", rj.output_text);
ok(`responses json_schema: ${rj.output_text} (${rj.status})`);

// A built-in tool the server does not run is refused.
await assert.rejects(openai.responses.create({ model, input: "x", tools: [{ type: "web_search_preview" }], max_output_tokens: 4 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
ok("responses: web_search_preview refused with 400 BadRequestError");

console.log(`PASS dialects_test.mjs: ${checks} checks`);
