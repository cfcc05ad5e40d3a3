// API parsing: typed requests from JSON, OpenAI error bodies for bad input, and a
// property test: random mutations of valid bodies never crash and give either a valid
// request or a 4xx.
#include "server/api.h"

#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace trellis::server {
namespace {

using json = nlohmann::json;

const ApiLimits kLimits{"tiny", 2048, 32000};

ApiError ChatError(const std::string& body) {
  auto r = ParseChatCompletionRequest(body, kLimits);
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? ApiError{} : r.error();
}

TEST(Api, ParsesAChatRequest) {
  auto r = ParseChatCompletionRequest(R"({"model":"tiny","messages":[{"role":"system","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_tokens":16,"temperature":0,"top_p":0.5,"seed":42,"stop":["x","yz"],"logprobs":true,"top_logprobs":3,
      "stream":true,"stream_options":{"include_usage":true},"user":"ignored"})",
                                      kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_EQ(r->gen.max_tokens, 16);
  EXPECT_EQ(r->gen.temperature, 0.0f);
  EXPECT_EQ(r->gen.top_p, 0.5f);
  EXPECT_EQ(r->gen.seed, 42u);
  EXPECT_EQ(r->gen.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r->gen.logprobs);
  EXPECT_EQ(r->gen.top_logprobs, 3);
  EXPECT_TRUE(r->gen.stream);
  EXPECT_TRUE(r->gen.include_usage);
}

TEST(Api, NullsAndAbsentModelAreDefaults) {
  auto r = ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"hi"}],"stop":null,"max_tokens":null})",
                                      kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->gen.max_tokens.has_value());
  EXPECT_TRUE(r->gen.stop.empty());
  auto s = ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"hi"}],"stop":"\n"})", kLimits);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->gen.stop, std::vector<std::string>{"\n"});
}

TEST(Api, RejectsBadChatBodies) {
  EXPECT_EQ(ChatError("{not json").message, "the request body is not valid JSON");
  EXPECT_EQ(ChatError("[1,2]").status, 400);
  EXPECT_EQ(ChatError(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(ChatError(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"tool","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"user","content":5}]})").param, "messages[0].content");
  const std::string m = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(ChatError("{" + m + R"(,"temperature":2.5})").param, "temperature");
  EXPECT_EQ(ChatError("{" + m + R"(,"temperature":-0.1})").param, "temperature");
  EXPECT_EQ(ChatError("{" + m + R"(,"temperature":"hot"})").param, "temperature");
  EXPECT_EQ(ChatError("{" + m + R"(,"top_p":0})").param, "top_p");
  EXPECT_EQ(ChatError("{" + m + R"(,"top_p":1.01})").param, "top_p");
  EXPECT_EQ(ChatError("{" + m + R"(,"max_tokens":-1})").param, "max_tokens");
  EXPECT_EQ(ChatError("{" + m + R"(,"max_tokens":100000})").param, "max_tokens");
  EXPECT_EQ(ChatError("{" + m + R"(,"max_tokens":1.5})").param, "max_tokens");
  EXPECT_EQ(ChatError("{" + m + R"(,"n":2})").param, "n");
  EXPECT_EQ(ChatError("{" + m + R"(,"stream":"yes"})").param, "stream");
  EXPECT_EQ(ChatError("{" + m + R"(,"stop":[1]})").param, "stop");
  EXPECT_EQ(ChatError("{" + m + R"(,"top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(ChatError("{" + m + R"(,"logprobs":true,"top_logprobs":21})").param, "top_logprobs");
  EXPECT_EQ(ChatError("{" + m + R"(,"stream_options":{"include_usage":true}})").param, "stream_options");
  EXPECT_EQ(ChatError("{" + m + R"(,"seed":"x"})").param, "seed");
  ApiError nf = ChatError("{" + m + R"(,"model":"gpt-4"})");
  EXPECT_EQ(nf.status, 404);
  EXPECT_EQ(nf.code, "model_not_found");
}

TEST(Api, ErrorBodyIsOpenAiShaped) {
  ApiError e = ChatError(R"({"messages":[{"role":"user","content":"x"}],"top_p":7})");
  json j = json::parse(ErrorJson(e));
  ASSERT_TRUE(j.contains("error"));
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(Api, Completions) {
  auto r = ParseCompletionRequest(R"({"model":"tiny","prompt":"Once","max_tokens":4,"logprobs":2,"echo":false})", kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r->prompt_text, "Once");
  EXPECT_TRUE(r->gen.logprobs);
  EXPECT_EQ(r->gen.top_logprobs, 2);
  auto t = ParseCompletionRequest(R"({"prompt":[1,450,7483]})", kLimits);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->prompt_tokens, (std::vector<int32_t>{1, 450, 7483}));
  auto one = ParseCompletionRequest(R"({"prompt":["x"]})", kLimits);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one->prompt_text, "x");
  for (const char* bad : {R"({})", R"({"prompt":5})", R"({"prompt":[]})", R"({"prompt":["a","b"]})",
                          R"({"prompt":[1,32000]})", R"({"prompt":[-1]})", R"({"prompt":"x","logprobs":6})",
                          R"({"prompt":"x","best_of":2})", R"({"prompt":"x","suffix":"y"})"}) {
    auto e = ParseCompletionRequest(bad, kLimits);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(e.error().status, 400) << bad;
    }
  }
}

TEST(Api, TokenizeDetokenize) {
  auto t = ParseTokenizeRequest(R"({"content":"hi","add_special":true,"with_pieces":true})");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->add_special);
  EXPECT_FALSE(ParseTokenizeRequest(R"({"content":1})").ok());
  auto d = ParseDetokenizeRequest(R"({"tokens":[1,2]})", kLimits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tokens.size(), 2u);
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens":[99999]})", kLimits).ok());
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens":["a"]})", kLimits).ok());
}

TEST(Api, ResponsesCarryCachedTokens) {
  CompletionResponse r;
  r.id = "chatcmpl-1";
  r.model = "tiny";
  r.text = "hi \xF0\x9F";  // a partial UTF-8 sequence must not throw
  r.finish_reason = "length";
  r.usage = {10, 2, 0};
  json j = json::parse(ResponseJson(r));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  StreamChunk c;
  c.role = true;
  c.usage_null = true;
  json cj = json::parse(ChunkJson(c));
  EXPECT_EQ(cj["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(cj["usage"].is_null());
  json u = json::parse(UsageChunkJson(Endpoint::kCompletion, "cmpl-1", 0, "tiny", {5, 1, 3}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

// Random JSON values used to replace or insert fields.
json RandomValue(std::mt19937& rng, int depth = 0) {
  switch (rng() % (depth > 2 ? 7 : 9)) {
    case 0: return nullptr;
    case 1: return static_cast<bool>(rng() % 2);
    case 2: return static_cast<int64_t>(rng() % 5) - 2;
    case 3: return static_cast<int64_t>(rng());
    case 4: return (static_cast<double>(rng() % 1000) - 300) / 100.0;
    case 5: return std::string("s") + std::to_string(rng() % 10);
    case 6: return static_cast<uint64_t>(rng()) << 40;
    case 7: {
      json a = json::array();
      for (unsigned i = 0; i < rng() % 4; ++i) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (const char* k : {"role", "content", "type", "text", "include_usage"}) {
        if (rng() % 2) o[k] = RandomValue(rng, depth + 1);
      }
      return o;
    }
  }
}

void Mutate(json& j, std::mt19937& rng) {
  static const char* kKeys[] = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
                                "top_p", "top_k", "min_p", "n", "seed", "stop", "logprobs", "top_logprobs",
                                "stream", "stream_options", "echo", "tools", "logit_bias", "repeat_penalty"};
  const char* key = kKeys[rng() % std::size(kKeys)];
  switch (rng() % 4) {
    case 0: j.erase(key); break;
    case 1: j[key] = RandomValue(rng); break;
    case 2:
      if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty()) {
        j["messages"][rng() % j["messages"].size()] = RandomValue(rng);
      }
      break;
    default:
      if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty() &&
          j["messages"][0].is_object()) {
        j["messages"][0][rng() % 2 ? "role" : "content"] = RandomValue(rng);
      }
  }
}

TEST(Api, FuzzedBodiesGiveARequestOrA4xx) {
  std::mt19937 rng(1234);
  const json base = json::parse(R"({"model":"tiny","messages":[{"role":"system","content":"s"},
      {"role":"user","content":"hi"}],"prompt":"p","max_tokens":8,"temperature":0.7,"stream":true})");
  int ok = 0, bad = 0;
  for (int i = 0; i < 20000; ++i) {
    json j = base;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) Mutate(j, rng);
    std::string body = j.dump();
    if (rng() % 8 == 0) body.resize(rng() % (body.size() + 1));  // truncated
    if (rng() % 16 == 0 && !body.empty()) body[rng() % body.size()] = static_cast<char>(rng());
    auto c = ParseChatCompletionRequest(body, kLimits);
    auto p = ParseCompletionRequest(body, kLimits);
    for (const ApiError* e : {c.ok() ? nullptr : &c.error(), p.ok() ? nullptr : &p.error()}) {
      if (!e) continue;
      ASSERT_GE(e->status, 400) << body;
      ASSERT_LT(e->status, 500) << body;
      ASSERT_FALSE(e->message.empty()) << body;
      ASSERT_NO_THROW(json::parse(ErrorJson(*e)));
    }
    if (c.ok()) {
      ++ok;
      ASSERT_FALSE(c->messages.empty());
      ASSERT_TRUE(c->gen.temperature >= 0 && c->gen.temperature <= 2);
      ASSERT_TRUE(c->gen.top_p > 0 && c->gen.top_p <= 1);
      ASSERT_TRUE(!c->gen.max_tokens || (*c->gen.max_tokens >= 0 && *c->gen.max_tokens <= kLimits.n_ctx));
      ASSERT_TRUE(c->gen.top_logprobs >= 0 && c->gen.top_logprobs <= kMaxTopLogprobs);
    } else {
      ++bad;
    }
    if (p.ok()) {
      ASSERT_TRUE(p->prompt_text || !p->prompt_tokens.empty());
      for (int32_t t : p->prompt_tokens) ASSERT_TRUE(t >= 0 && t < kLimits.n_vocab);
    }
  }
  EXPECT_GT(ok, 100);
  EXPECT_GT(bad, 100);
}

}  // namespace
}  // namespace trellis::server
