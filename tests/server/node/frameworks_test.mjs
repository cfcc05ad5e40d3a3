// The two agent frameworks most JavaScript agents are written with, unchanged, against
// `trellis serve`: the Vercel AI SDK (generateObject with a zod schema, generateText with
// tools over several steps, streamText with a tool) through its OpenAI-compatible
// provider, and LangChain.js (withStructuredOutput in its JSON-schema and
// function-calling modes, bindTools with the result sent back as a ToolMessage). Each
// framework builds its own requests and parses the answers with its own code; a random
// model writes none of these answers without the server's grammar.
// usage: node frameworks_test.mjs BASE_URL API_KEY MODEL
import assert from "node:assert/strict";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { ChatOpenAI } from "@langchain/openai";
import { HumanMessage, SystemMessage, ToolMessage } from "@langchain/core/messages";
import { z } from "zod";

const [baseURL, apiKey, model] = process.argv.slice(2);
let checks = 0;
const ok = (what) => { checks++; console.log(`  ok   ${what}`); };
const system = "You are a travel agent that calls tools. ".repeat(20);

const Trip = z.object({
  city: z.string().max(16),
  nights: z.number().int(),
  travellers: z.array(z.object({ name: z.string().max(12), adult: z.boolean() })).min(1).max(3),
  class: z.enum(["economy", "business"]),
});
const Weather = z.object({ city: z.string().max(20), unit: z.enum(["celsius", "fahrenheit"]) });

// ---- Vercel AI SDK (ai 5, @ai-sdk/openai-compatible) ------------------------------------
const provider = createOpenAICompatible({
  name: "trellis", baseURL: `${baseURL}/v1`, apiKey, supportsStructuredOutputs: true,
});
const lm = provider.chatModel(model);
const sampling = (seed, temperature) => ({ seed, temperature, topP: 1, maxRetries: 0 });
// One call per step: a random model given parallel calls goes on writing calls until
// max_tokens. The provider passes its options through to the request body.
const oneCall = { providerOptions: { trellis: { parallel_tool_calls: false } } };

for (const [seed, temp] of [[11, 0], [12, 0.9]]) {
  const r = await generateObject({
    model: lm, schema: Trip, schemaName: "trip", system, prompt: "Plan a trip.", maxOutputTokens: 400,
    ...sampling(seed, temp),
  });
  assert.equal(r.finishReason, "stop");
  assert.ok(Trip.safeParse(r.object).success, JSON.stringify(r.object));
}
ok("AI SDK generateObject: 2 objects, each parsed and valid by the SDK's own zod check");

// Several steps: a forced call in each of the first two steps (the SDK runs the tool and
// sends the result back), then an answer in text; the receipt shows the steps' shared prefix.
const seen = [];
const steps = await generateText({
  model: lm, system, prompt: "Weather in Oslo, then in Rome?", maxOutputTokens: 200,
  tools: {
    get_weather: tool({
      description: "Weather now in a city.", inputSchema: Weather,
      execute: async ({ city, unit }) => { seen.push(city); return { city, unit, temp: -3 }; },
    }),
  },
  stopWhen: stepCountIs(3), ...oneCall,
  prepareStep: async ({ stepNumber }) => ({ toolChoice: stepNumber < 2 ? "required" : "none" }),
  ...sampling(21, 0.7),
});
assert.equal(steps.steps.length, 3, JSON.stringify(steps.steps.map((s) => s.finishReason)));
for (const s of steps.steps.slice(0, 2)) {
  assert.equal(s.finishReason, "tool-calls");
  assert.equal(s.toolCalls.length, 1);
  assert.equal(s.toolCalls[0].toolName, "get_weather");
  assert.ok(Weather.safeParse(s.toolCalls[0].input).success, JSON.stringify(s.toolCalls[0].input));
  assert.equal(s.toolResults.length, 1);
}
assert.equal(seen.length, 2);
assert.notEqual(steps.steps[2].finishReason, "tool-calls");
assert.equal(steps.steps[2].toolCalls.length, 0);
const cached = steps.steps[2].usage.cachedInputTokens ?? 0;
assert.ok(cached >= steps.steps[0].usage.inputTokens / 2, JSON.stringify(steps.steps[2].usage));
ok(`AI SDK generateText: 3 steps, calls get_weather(${seen.join("), get_weather(")}), then text; ` +
   `step 3 reused ${cached} of ${steps.steps[2].usage.inputTokens} prompt tokens`);

// Streaming: the SDK assembles the streamed call from its deltas.
const st = streamText({
  model: lm, system, prompt: "Weather in Lima?", maxOutputTokens: 200, toolChoice: "required", ...oneCall,
  tools: { get_weather: tool({ description: "Weather now in a city.", inputSchema: Weather }) },
  ...sampling(31, 1.0),
});
const streamedCalls = await st.toolCalls;
assert.equal(await st.finishReason, "tool-calls");
assert.equal(streamedCalls.length, 1);
assert.ok(Weather.safeParse(streamedCalls[0].input).success, JSON.stringify(streamedCalls[0].input));
ok(`AI SDK streamText: a streamed call assembled by the SDK: ${JSON.stringify(streamedCalls[0].input)}`);

// ---- LangChain.js (@langchain/openai 0.6) ----------------------------------------------
const chat = (seed, temperature) => new ChatOpenAI({
  model, apiKey, temperature, topP: 1, maxTokens: 400, maxRetries: 0,
  configuration: { baseURL: `${baseURL}/v1` }, modelKwargs: { seed },
});

for (const method of ["jsonSchema", "functionCalling"]) {
  const structured = chat(41, 0.8).withStructuredOutput(Trip, { name: "trip", method });
  const trip = await structured.invoke([new SystemMessage(system), new HumanMessage("Plan a trip.")]);
  assert.ok(Trip.safeParse(trip).success, JSON.stringify(trip));
  ok(`LangChain withStructuredOutput (${method}): ${JSON.stringify(trip).slice(0, 60)}...`);
}

const weatherTool = { name: "get_weather", description: "Weather now in a city.", schema: Weather };
const bound = chat(51, 0.7).bindTools([weatherTool], { tool_choice: "required" });
const history = [new SystemMessage(system), new HumanMessage("Weather in Oslo?")];
const ai1 = await bound.invoke(history);
assert.equal(ai1.tool_calls.length >= 1, true, JSON.stringify(ai1));
for (const c of ai1.tool_calls) {
  assert.equal(c.name, "get_weather");
  assert.ok(Weather.safeParse(c.args).success, JSON.stringify(c.args));
}
assert.equal(ai1.invalid_tool_calls?.length ?? 0, 0);
history.push(ai1, ...ai1.tool_calls.map((c) => new ToolMessage({ tool_call_id: c.id, content: '{"temp": -3}' })));
const ai2 = await chat(52, 0.7).bindTools([weatherTool], { tool_choice: "none" }).invoke(history);
assert.equal(ai2.tool_calls.length, 0);
assert.equal(typeof ai2.content, "string");
const usage = ai2.usage_metadata;
assert.ok((usage?.input_token_details?.cache_read ?? 0) >= ai1.usage_metadata.input_tokens / 2, JSON.stringify(usage));
ok(`LangChain bindTools: ${ai1.tool_calls.length} call(s) ${JSON.stringify(ai1.tool_calls[0].args)}, ` +
   `ToolMessage back, turn 2 reused ${usage.input_token_details.cache_read} of ${usage.input_tokens} prompt tokens`);

console.log(`PASS frameworks_test.mjs: ${checks} checks`);
