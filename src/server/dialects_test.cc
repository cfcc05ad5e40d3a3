// The other dialects: their translation onto the chat request (messages, tools, fields,
// errors renamed into the dialect's names), their answer writers (bodies, event streams,
// NDJSON), and the store of responses kept for previous_response_id.
#include "server/dialects.h"

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace trellis::server {
namespace {

using json = nlohmann::json;

const ApiLimits kDialectLimits{"tiny", 2048, 32000};

std::string ExtraField(const ChatMessage& m, const std::string& key) {
  for (const auto& [k, v] : m.extra) {
    if (k == key) return jinja::ToJson(v);
  }
  return "";
}

// ---- Anthropic ----

TEST(Anthropic, TranslatesTurnsToolsAndFields) {
  auto r = ParseAnthropicRequest(R"({"model":"tiny","max_tokens":32,"system":[{"type":"text","text":"Be brief."}],
    "messages":[{"role":"user","content":"Weather?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"look it up","signature":"x"},
        {"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get","input":{"z":1,"a":"b"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"12 C"}]},
        {"type":"text","text":"And tomorrow?","cache_control":{"type":"ephemeral"}}]}],
    "tools":[{"name":"get","description":"d","input_schema":{"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}}}],
    "tool_choice":{"type":"any","disable_parallel_tool_use":true},
    "stop_sequences":["END"],"temperature":0.5,"top_k":7,"metadata":{"user_id":"u"}})",
                                 kDialectLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ChatCompletionRequest& c = r->chat;
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[0].content, "Be brief.");
  EXPECT_EQ(c.messages[2].role, "assistant");
  EXPECT_EQ(c.messages[2].content, "Checking.");
  EXPECT_EQ(ExtraField(c.messages[2], "reasoning_content"), "\"look it up\"");
  // The call's input keeps the client's key order.
  EXPECT_NE(ExtraField(c.messages[2], "tool_calls").find(R"("arguments": {"z": 1, "a": "b"})"), std::string::npos)
      << ExtraField(c.messages[2], "tool_calls");
  EXPECT_EQ(c.messages[3].role, "tool");
  EXPECT_EQ(c.messages[3].content, "12 C");
  EXPECT_EQ(ExtraField(c.messages[3], "tool_call_id"), "\"toolu_1\"");
  EXPECT_EQ(c.messages[4].role, "user");
  EXPECT_EQ(c.messages[4].content, "And tomorrow?");
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(c.tools[0].parameters, R"({"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}})");
  EXPECT_EQ(c.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(c.parallel_tool_calls);
  EXPECT_EQ(c.gen.max_tokens, 32);
  EXPECT_EQ(c.gen.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(c.gen.temperature, 0.5f);
  EXPECT_EQ(c.gen.top_k, 7);
}

TEST(Anthropic, RefusesInItsOwnNames) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"messages":[{"role":"user","content":"x"}]})", "max_tokens"},  // required
      {R"({"max_tokens":4,"temperature":1.5,"messages":[{"role":"user","content":"x"}]})", "temperature"},
      {R"({"max_tokens":0,"messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})", "messages[0].content[0].type"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"a","x":1}]}]})", "messages[0].content[0].x"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"nope","content":"r"}]}]})",
       "messages[0]"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{"type":"frob"}}]})",
       "tools[0].input_schema"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"w"}]})",
       "tools[0].type"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"stop_sequences":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       "stop_sequences"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}})", "thinking"},
      {R"({"max_tokens":4,"messages":[{"role":"user","content":"x"}],"frobnicate":1})", "frobnicate"},
  };
  for (const Case& k : cases) {
    auto r = ParseAnthropicRequest(k.body, kDialectLimits);
    ASSERT_FALSE(r.ok()) << k.body;
    EXPECT_EQ(r.error().status, 400) << k.body;
    EXPECT_EQ(r.error().param, k.param) << k.body << ": " << r.error().message;
  }
  auto other = ParseAnthropicRequest(R"({"model":"claude","max_tokens":4,"messages":[{"role":"user","content":"x"}]})", kDialectLimits);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().status, 404);
  const json body = json::parse(AnthropicErrorResponse(other.error()).body);
  EXPECT_EQ(body["type"], "error");
  EXPECT_EQ(body["error"]["type"], "not_found_error");
  // Above the context, max_tokens is "until the context is full" (Claude Code sends 32000).
  auto big = ParseAnthropicRequest(R"({"max_tokens":32000,"messages":[{"role":"user","content":"x"}]})", kDialectLimits);
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_FALSE(big->chat.gen.max_tokens.has_value());
  // count_tokens takes the same body without max_tokens.
  EXPECT_TRUE(ParseAnthropicCountRequest(R"({"messages":[{"role":"user","content":"x"}]})", kDialectLimits).ok());
}

json SseEvents(const std::string& sse, std::vector<std::string>* names = nullptr) {
  json out = json::array();
  size_t pos = 0;
  while ((pos = sse.find("event: ", pos)) != std::string::npos) {
    const size_t nl = sse.find('\n', pos);
    const std::string name = sse.substr(pos + 7, nl - pos - 7);
    const size_t data = sse.find("data: ", nl);
    const size_t end = sse.find("\n\n", data);
    json j = json::parse(sse.substr(data + 6, end - data - 6));
    EXPECT_EQ(j["type"], name);
    if (names) names->push_back(name);
    out.push_back(std::move(j));
    pos = end;
  }
  return out;
}

TEST(Anthropic, StreamsBlocksInOrder) {
  AnthropicWriter w("msg_1", "tiny");
  w.OnPrompt(20);
  std::string s = w.Open();
  AnswerDelta d1;
  d1.reasoning = "hmm";
  s += w.Delta(d1);
  AnswerDelta d2;
  d2.content = "Hi";
  s += w.Delta(d2);
  AnswerDelta d3;
  d3.calls.push_back({"toolu_x", "get", "{\"a\":", 0, true});
  d3.calls.push_back({"", "", "1}", 0, false});
  s += w.Delta(d3);
  AnswerEnd end{"tool_calls", "", {}};
  end.usage.prompt_tokens = 20;
  end.usage.cached_tokens = 16;
  end.usage.completion_tokens = 9;
  s += w.Close(end);
  std::vector<std::string> names;
  const json ev = SseEvents(s, &names);
  const std::vector<std::string> want = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                         "content_block_start", "content_block_delta", "content_block_stop",
                                         "content_block_start", "content_block_delta", "content_block_delta",
                                         "content_block_stop", "message_delta", "message_stop"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(ev[0]["message"]["usage"]["input_tokens"], 20);
  EXPECT_EQ(ev[1]["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[4]["index"], 1);
  EXPECT_EQ(ev[7]["content_block"]["id"], "toolu_x");
  EXPECT_EQ(ev[8]["delta"]["partial_json"].get<std::string>() + ev[9]["delta"]["partial_json"].get<std::string>(), "{\"a\":1}");
  EXPECT_EQ(ev[11]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[11]["usage"]["input_tokens"], 4);  // not read from the cache
  EXPECT_EQ(ev[11]["usage"]["cache_read_input_tokens"], 16);
  EXPECT_FALSE(ev[11]["usage"].contains("cache"));  // no receipt given: none written
  AnthropicWriter w2("msg_2", "tiny");
  AnswerEnd receipt = end;
  receipt.usage.cache = CacheUsage{};
  receipt.usage.cache->local = 16;
  receipt.usage.cache->computed = 4;
  const json ev2 = SseEvents(w2.Close(receipt));
  EXPECT_EQ(ev2[2]["usage"]["cache"]["local"], 16);  // the receipt, as on the OpenAI path
  EXPECT_EQ(ev2[2]["usage"]["cache"]["computed"], 4);
}

TEST(Anthropic, WholeMessageStopReasons) {
  AnthropicWriter w("msg_1", "tiny");
  WholeAnswer a;
  a.text = "x";
  a.end.finish_reason = "stop";
  a.end.stop_string = "END";
  json j = json::parse(w.Whole(a).body);
  EXPECT_EQ(j["stop_reason"], "stop_sequence");
  EXPECT_EQ(j["stop_sequence"], "END");
  a.end = {"length", "", {}};
  EXPECT_EQ(json::parse(w.Whole(a).body)["stop_reason"], "max_tokens");
  a.end = {"stop", "", {}};
  EXPECT_EQ(json::parse(w.Whole(a).body)["stop_reason"], "end_turn");
  a.text.clear();
  a.tool_calls.push_back({"toolu_1", "get", R"({"a":1})"});
  a.end = {"tool_calls", "", {}};
  j = json::parse(w.Whole(a).body);
  EXPECT_EQ(j["stop_reason"], "tool_use");
  ASSERT_EQ(j["content"].size(), 1u);
  EXPECT_EQ(j["content"][0]["input"], json({{"a", 1}}));
}

// ---- Responses ----

TEST(Responses, ItemsBecomeTurns) {
  auto r = ParseResponsesRequest(R"({"model":"tiny","instructions":"Be brief.","max_output_tokens":12,
    "input":[{"role":"user","content":[{"type":"input_text","text":"Weather?"}]},
      {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"bG9vayBpdCB1cA=="},
      {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
      {"type":"function_call","call_id":"call_1","name":"get","arguments":"{\"a\":1}"},
      {"type":"function_call_output","call_id":"call_1","output":"12 C"}],
    "tools":[{"type":"function","name":"get","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}],
    "text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}})",
                                 kDialectLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  std::string conversation;
  auto c = ResponsesChat(*r, "", kDialectLimits, &conversation);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->messages.size(), 4u);
  EXPECT_EQ(c->messages[0].role, "system");
  EXPECT_EQ(c->messages[2].role, "assistant");
  EXPECT_EQ(c->messages[2].content, "Checking.");
  EXPECT_EQ(ExtraField(c->messages[2], "reasoning_content"), "\"look it up\"");  // base64 decoded
  EXPECT_NE(ExtraField(c->messages[2], "tool_calls").find("call_1"), std::string::npos);
  EXPECT_EQ(c->messages[3].role, "tool");
  EXPECT_EQ(c->gen.max_tokens, 12);
  EXPECT_NE(c->gen.grammar, nullptr);
  EXPECT_EQ(c->tools.size(), 1u);
  // The conversation kept for a later turn: without the instructions.
  EXPECT_EQ(json::parse(conversation).size(), 3u);

  // A later turn: the history first, then the new input.
  auto next = ParseResponsesRequest(R"({"input":"And tomorrow?","previous_response_id":"resp_1"})", kDialectLimits);
  ASSERT_TRUE(next.ok()) << next.error().message;
  std::string conv2;
  auto c2 = ResponsesChat(*next, conversation, kDialectLimits, &conv2);
  ASSERT_TRUE(c2.ok()) << c2.error().message;
  ASSERT_EQ(c2->messages.size(), 4u);
  EXPECT_EQ(c2->messages[3].content, "And tomorrow?");
}

TEST(Responses, RefusesInItsOwnNames) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"model":"tiny"})", "input"},
      {R"({"input":"x","max_output_tokens":0})", "max_output_tokens"},
      {R"({"input":"x","tools":[{"type":"web_search_preview"}]})", "tools[0].type"},
      {R"({"input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"frob"}}]})", "tools[0].parameters"},
      {R"({"input":"x","text":{"format":{"type":"json_schema","schema":{"type":"frob"}}}})", "text.format.json_schema.schema"},
      {R"({"input":[{"type":"function_call_output","call_id":"nope","output":"r"}]})", "input[0]"},
      {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]})", "input[0].content"},
      {R"({"input":"x","truncation":"auto"})", "truncation"},
      {R"({"input":"x","background":true})", "background"},
      {R"({"input":"x","tool_choice":{"type":"function","name":"f","x":1}})", "tool_choice.x"},
      {R"({"input":"x","frobnicate":1})", "frobnicate"},
  };
  for (const Case& k : cases) {
    auto r = ParseResponsesRequest(k.body, kDialectLimits);
    ASSERT_FALSE(r.ok()) << k.body;
    EXPECT_EQ(r.error().status, 400) << k.body;
    EXPECT_EQ(r.error().param, k.param) << k.body << ": " << r.error().message;
  }
}

TEST(Responses, StreamEventsAndTheStoredAnswer) {
  ResponsesRequest req;
  req.encrypted_reasoning = true;
  std::string stored_body, stored_answer;
  ResponsesWriter w("resp_00ab", 1, "tiny", req, [&](const std::string& b, const std::string& a) {
    stored_body = b;
    stored_answer = a;
  });
  std::string s = w.Open();
  AnswerDelta d1;
  d1.reasoning = "hm";
  d1.content = "Hi";
  s += w.Delta(d1);
  AnswerDelta d2;
  d2.calls.push_back({"call_9", "get", "{}", 0, true});
  s += w.Delta(d2);
  s += w.Close({"length", "", {}});
  std::vector<std::string> names;
  const json ev = SseEvents(s, &names);
  EXPECT_EQ(names.front(), "response.created");
  EXPECT_EQ(names.back(), "response.incomplete");  // cut by max_output_tokens
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i]["sequence_number"], i);
  const json& resp = ev.back()["response"];
  ASSERT_EQ(resp["output"].size(), 3u);
  EXPECT_EQ(resp["output"][0]["type"], "reasoning");
  EXPECT_EQ(resp["output"][0]["encrypted_content"], "aG0=");
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "Hi");
  EXPECT_EQ(resp["output"][2]["call_id"], "call_9");
  EXPECT_EQ(resp["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(json::parse(stored_body)["id"], "resp_00ab");
  const json answer = json::parse(stored_answer);
  EXPECT_EQ(answer["content"], "Hi");
  EXPECT_EQ(answer["reasoning_content"], "hm");
  EXPECT_EQ(answer["tool_calls"][0]["id"], "call_9");
}

TEST(ResponseStore, BoundsAgeAndOwners) {
  ResponseStore s(2, 1000, std::chrono::seconds(60));
  s.Put("a", {1, "[]", "A"});
  s.Put("b", {1, "[]", "B"});
  EXPECT_FALSE(s.Get("a", 2));  // another key's
  ASSERT_TRUE(s.Get("a", 1));
  s.Put("c", {1, "[]", "C"});  // over 2 entries: the oldest goes
  EXPECT_FALSE(s.Get("a", 1));
  EXPECT_TRUE(s.Get("b", 1) && s.Get("c", 1));
  s.Put("big", {1, std::string(990, 'x'), ""});  // over the bytes: the others go
  EXPECT_FALSE(s.Get("b", 1));
  EXPECT_TRUE(s.Get("big", 1));
  s.Put("huge", {1, std::string(2000, 'x'), ""});  // larger than the store: not kept
  EXPECT_FALSE(s.Get("huge", 1));
  EXPECT_FALSE(s.Erase("big", 2));
  EXPECT_TRUE(s.Erase("big", 1));
  ResponseStore brief(4, 1000, std::chrono::seconds(0));
  brief.Put("a", {1, "[]", "A"});
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_FALSE(brief.Get("a", 1));  // expired
}

// ---- Ollama ----

TEST(Ollama, OptionsDefaultsAndModelNames) {
  auto r = ParseOllamaChat(R"({"model":"tiny:latest","messages":[{"role":"user","content":"Hi"}],
    "options":{"num_predict":9,"seed":3,"stop":["x"],"num_thread":4},"format":"json","stream":false,"keep_alive":"5m"})",
                           kDialectLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "tiny:latest");
  EXPECT_EQ(r->chat.gen.max_tokens, 9);
  EXPECT_EQ(r->chat.gen.seed, 3u);
  EXPECT_FALSE(r->chat.gen.stream);
  EXPECT_NE(r->chat.gen.grammar, nullptr);
  // Ollama's defaults where the request says nothing.
  EXPECT_EQ(r->chat.gen.top_p, 0.9f);
  EXPECT_EQ(r->chat.gen.min_p, 0.0f);
  EXPECT_EQ(r->chat.gen.repeat_penalty, 1.1f);
  EXPECT_EQ(r->chat.gen.repeat_last_n, 64);
  auto streamed = ParseOllamaChat(R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}]})", kDialectLimits);
  ASSERT_TRUE(streamed.ok());
  EXPECT_TRUE(streamed->chat.gen.stream);  // Ollama's default
  auto missing = ParseOllamaChat(R"({"model":"llama3","messages":[]})", kDialectLimits);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().status, 404);
  EXPECT_EQ(json::parse(OllamaErrorResponse(missing.error()).body), json({{"error", "model 'llama3' not found"}}));
  auto load = ParseOllamaGenerate(R"({"model":"tiny"})", kDialectLimits);
  ASSERT_TRUE(load.ok());
  EXPECT_TRUE(load->load_only);
  auto raw = ParseOllamaGenerate(R"({"model":"tiny","prompt":"<s>x","raw":true,"options":{"num_ctx":100}})", kDialectLimits);
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  ASSERT_TRUE(raw->raw.has_value());
  EXPECT_EQ(raw->raw->prompt_text, "<s>x");
  EXPECT_EQ(raw->num_ctx, 100);
  auto off = ParseOllamaChat(R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"think":false})", kDialectLimits);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->chat.reasoning_format, "none");
  EXPECT_TRUE(off->chat.thinking_off);
  EXPECT_TRUE(off->chat.template_kwargs.empty());  // set by the server, for a template that thinks
}

TEST(Ollama, RefusesInItsOwnNames) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"messages":[]})", "model"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"temperature":9}})", "options.temperature"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"num_predict":0}})", "options.num_predict"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"num_predict":18446744073709551615}})",
       "options.num_predict"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"num_ctx":4096}})", "options.num_ctx"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"frob":1}})", "options.frob"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x","images":["aGk="]}]})", "messages[0].images"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"format":{"type":"frob"}})", "format"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"options":{"mirostat":2}})", "options.mirostat"},
      {R"({"model":"tiny","messages":[{"role":"tool","content":"x","tool_call_id":7}]})", "tool_call_id"},
  };
  for (const Case& k : cases) {
    auto r = ParseOllamaChat(k.body, kDialectLimits);
    ASSERT_FALSE(r.ok()) << k.body;
    EXPECT_EQ(r.error().status, 400) << k.body;
    EXPECT_EQ(r.error().param, k.param) << k.body << ": " << r.error().message;
  }
  auto ctx = ParseOllamaGenerate(R"({"model":"tiny","prompt":"x","context":[1,2]})", kDialectLimits);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.error().param, "context");
}

TEST(Ollama, NdjsonLinesEndWithTheStats) {
  OllamaWriter w("tiny", /*generate=*/false);
  AnswerDelta d;
  d.content = "Hi";
  std::string s = w.Delta(d);
  AnswerDelta call;
  call.calls.push_back({"call_1", "get", "{\"a\":", 0, true});
  call.calls.push_back({"", "", "1}", 0, false});
  s += w.Delta(call);
  AnswerEnd end{"tool_calls", "", {}};
  end.usage.prompt_tokens = 10;
  end.usage.cached_tokens = 4;
  end.usage.completion_tokens = 3;
  s += w.Close(end);
  std::vector<json> lines;
  for (size_t pos = 0, nl; (nl = s.find('\n', pos)) != std::string::npos; pos = nl + 1) lines.push_back(json::parse(s.substr(pos, nl - pos)));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["message"]["content"], "Hi");
  EXPECT_EQ(lines[0]["done"], false);
  EXPECT_EQ(lines[1]["message"]["tool_calls"][0]["function"]["arguments"], json({{"a", 1}}));
  EXPECT_EQ(lines[2]["done"], true);
  EXPECT_EQ(lines[2]["done_reason"], "stop");
  EXPECT_EQ(lines[2]["prompt_eval_count"], 6);
  EXPECT_EQ(lines[2]["eval_count"], 3);
  EXPECT_EQ(OllamaName("tiny"), "tiny:latest");
  EXPECT_EQ(OllamaName("tiny:q4"), "tiny:q4");
}

}  // namespace
}  // namespace trellis::server
