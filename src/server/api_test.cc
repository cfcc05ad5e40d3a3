// API parsing: typed requests from JSON, OpenAI error bodies for bad input, and a
// property test: random mutations of valid bodies never crash and give either a valid
// request or a 4xx.
#include "server/api.h"

#include "grammar/stacks.h"

#include <map>
#include <random>
#include <tuple>

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
  EXPECT_EQ(ChatError("{not json").message.rfind("the request body is not valid JSON (at byte ", 0), 0u);
  EXPECT_EQ(ChatError("[1,2]").status, 400);
  EXPECT_EQ(ChatError(R"({"messages":[]})").param, "messages");
  EXPECT_EQ(ChatError(R"({"messages":"hi"})").param, "messages");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages[0].role");
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
  r.usage = {10, 2, 0, std::nullopt};
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
  EXPECT_FALSE(j["usage"].contains("cache"));
  CacheUsage cu;
  cu.local = 1;
  cu.store = 2;
  cu.store_remote = 2;
  cu.computed = 2;
  cu.miss_reasons = {{"not_stored", 2}};
  json u = json::parse(UsageChunkJson(Endpoint::kCompletion, "cmpl-1", 0, "tiny", {5, 1, 3, cu}));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
  EXPECT_EQ(u["usage"]["cache"]["local"], 1);
  EXPECT_EQ(u["usage"]["cache"]["store"], 2);
  EXPECT_EQ(u["usage"]["cache"]["store_tiers"]["remote"], 2);
  EXPECT_EQ(u["usage"]["cache"]["store_tiers"]["memory"], 0);
  EXPECT_EQ(u["usage"]["cache"]["computed"], 2);
  EXPECT_EQ(u["usage"]["cache"]["miss_reasons"]["not_stored"], 2);
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
                                "stream", "stream_options", "echo", "tools", "logit_bias", "repeat_penalty",
                                "presence_penalty", "frequency_penalty", "response_format", "tool_choice"};
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
    // Each endpoint refuses the other's main field as unknown: each gets the body without it.
    auto damaged = [&](const char* other) {
      json k = j;
      if (k.is_object()) k.erase(other);
      std::string body = k.dump();
      if (rng() % 8 == 0) body.resize(rng() % (body.size() + 1));  // truncated
      if (rng() % 16 == 0 && !body.empty()) body[rng() % body.size()] = static_cast<char>(rng());
      return body;
    };
    const std::string body = damaged("prompt"), completion_body = damaged("messages");
    auto c = ParseChatCompletionRequest(body, kLimits);
    auto p = ParseCompletionRequest(completion_body, kLimits);
    for (const ApiError* e : {c.ok() ? nullptr : &c.error(), p.ok() ? nullptr : &p.error()}) {
      if (!e) continue;
      ASSERT_GE(e->status, 400) << body;
      ASSERT_LT(e->status, 500) << body;
      ASSERT_FALSE(e->message.empty()) << body;
      ASSERT_TRUE(json::accept(ErrorJson(*e))) << ErrorJson(*e);
    }
    if (c.ok()) {
      ++ok;
      ASSERT_FALSE(c->messages.empty());
      ASSERT_TRUE(c->gen.temperature >= 0 && c->gen.temperature <= 2);
      ASSERT_TRUE(c->gen.top_p > 0 && c->gen.top_p <= 1);
      ASSERT_TRUE(!c->gen.max_tokens || (*c->gen.max_tokens >= 1 && *c->gen.max_tokens <= kLimits.n_ctx));
      ASSERT_TRUE(c->gen.top_logprobs >= 0 && c->gen.top_logprobs <= kMaxTopLogprobs);
      ASSERT_TRUE(c->gen.presence_penalty >= -2 && c->gen.presence_penalty <= 2);
      ASSERT_TRUE(c->gen.frequency_penalty >= -2 && c->gen.frequency_penalty <= 2);
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

// ---- hostile input (issue 9) ---------------------------------------------------------

const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";
std::string Chat(const std::string& extra) { return "{" + kMsgs + "," + extra + "}"; }

std::string Nested(int depth, const std::string& inner = "1") {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

TEST(ApiHostile, DepthIsCheckedBeforeParsing) {
  // The top-level object is level 1: 31 arrays inside an ignored field are fine, 32 are not.
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("user":)" + Nested(31)), kLimits).ok());
  ApiError e = ChatError(Chat(R"("user":)" + Nested(32)));
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("levels deep"), std::string::npos) << e.message;
  // Far too deep for a recursive parser or dump(), and for every reader.
  const std::string deep = Nested(200000);
  for (const std::string& body : {Chat(R"("user":)" + deep), Chat(R"("max_tokens":)" + deep),
                                  R"({"prompt":)" + deep + "}", R"({"content":)" + deep + "}"}) {
    auto c = ParseChatCompletionRequest(body, kLimits);
    auto p = ParseCompletionRequest(body, kLimits);
    auto t = ParseTokenizeRequest(body, kLimits);
    auto d = ParseDetokenizeRequest(body, kLimits);
    ASSERT_FALSE(c.ok());
    ASSERT_FALSE(p.ok());
    ASSERT_FALSE(t.ok());
    ASSERT_FALSE(d.ok());
    for (const ApiError* x : {&c.error(), &p.error(), &t.error(), &d.error()}) {
      EXPECT_EQ(x->status, 400);
      EXPECT_NE(x->message.find("levels deep"), std::string::npos) << x->message;
    }
  }
  // Unbalanced closers do not let a body go deeper unnoticed.
  EXPECT_FALSE(CheckJsonShape("]]]]" + Nested(32)).has_value());
  EXPECT_TRUE(CheckJsonShape("]]]]" + Nested(33)).has_value());
}

TEST(ApiHostile, ShapeScanSkipsStringsAndEscapes) {
  const std::string brackets(1000, '[');
  EXPECT_FALSE(CheckJsonShape(R"({"a":")" + brackets + R"("})").has_value());
  EXPECT_FALSE(CheckJsonShape(R"({"a":"\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"})").has_value());
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_TRUE(CheckJsonShape(R"({"a":"\\")" + Nested(40) + "}").has_value());
  auto ok = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{"}]})",
      kLimits);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->messages[0].content.size(), 42u + 1 + 35);
}

TEST(ApiHostile, ValueCountIsCheckedBeforeParsing) {
  ApiLimits small = kLimits;
  small.json.max_values = 102;
  std::string arr = "[";
  for (int i = 0; i < 100; ++i) arr += i ? ",0" : "0";
  arr += "]";
  // Counted: the top-level value, "{", "[" and 99 commas.
  EXPECT_TRUE(ParseDetokenizeRequest(R"({"tokens":)" + arr + "}", small).ok());
  arr.insert(1, "0,");
  auto e = ParseDetokenizeRequest(R"({"tokens":)" + arr + "}", small);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("JSON values"), std::string::npos) << e.error().message;
  // The default: a million elements (2 MB of text) are refused without building a DOM.
  std::string big = R"({"tokens":[0)";
  big.reserve(2'000'100);
  for (size_t i = 0; i < kMaxJsonValues; ++i) big += ",0";
  big += "]}";
  auto b = ParseDetokenizeRequest(big, kLimits);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().status, 400);
  EXPECT_NE(b.error().message.find("JSON values"), std::string::npos);
}

TEST(ApiHostile, ErrorMessagesNeverEchoValuesWhole) {
  const std::string huge(100000, 'x');
  const std::vector<std::string> bodies = {
      Chat(R"("max_tokens":)" + Nested(30)),          Chat(R"("temperature":")" + huge + "\""),
      Chat(R"("temperature":{"a":")" + huge + "\"}"), Chat(R"("model":")" + huge + "\""),
      Chat(R"("seed":[")" + huge + "\"]"),             R"({"messages":[{"role":")" + huge + R"(","content":"x"}]})",
      Chat(R"("top_k":)" + std::string(5000, '9')),    Chat(R"("top_p":1)" + std::string(5000, '0')),
      Chat(R"("stream":")" + huge + "\""),             "{\"messages\":\"" + huge,
      Chat(R"("max_tokens":1)" + std::string(400, '0')),  // 1e400: out of range for a double
  };
  for (const std::string& body : bodies) {
    auto r = ParseChatCompletionRequest(body, kLimits);
    ASSERT_FALSE(r.ok()) << body.substr(0, 80);
    EXPECT_LT(r.error().message.size(), 300u) << r.error().message.substr(0, 300);
    EXPECT_LT(ErrorJson(r.error()).size(), 500u);
  }
  for (const std::string& body : {R"({"prompt":[")" + huge + R"(",1]})", R"({"prompt":[1,")" + huge + R"("]})",
                                  R"({"prompt":[1,)" + Nested(20) + "]}"}) {
    auto r = ParseCompletionRequest(body, kLimits);
    ASSERT_FALSE(r.ok()) << body.substr(0, 80);
    EXPECT_LT(r.error().message.size(), 300u) << r.error().message.substr(0, 300);
  }
  auto d = ParseDetokenizeRequest(R"({"tokens":[)" + Nested(25) + "]}", kLimits);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message.find('['), std::string::npos) << d.error().message;
}

TEST(ApiHostile, IllFormedUtf8IsACleanError) {
  for (const std::string bad : {"\xFF", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC3",
                                "\xE2\x82", "\x80"}) {
    const std::string body = R"({"messages":[{"role":"user","content":"a)" + bad + R"(b"}]})";
    ApiError e = ChatError(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("UTF-8"), std::string::npos) << e.message;
    EXPECT_TRUE(json::accept(ErrorJson(e))) << ErrorJson(e);
    auto t = ParseTokenizeRequest(R"({"content":")" + bad + R"("})", kLimits);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().status, 400);
  }
  // A lone surrogate escape is valid UTF-8 text but not valid JSON.
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"user","content":"\ud800"}]})").status, 400);
  // Well-formed multi-byte text passes: 2, 3 and 4 bytes, U+10FFFF, U+FFFD.
  auto ok = ParseChatCompletionRequest(
      "{\"messages\":[{\"role\":\"user\",\"content\":\"\xC3\xA4\xE2\x82\xAC\xF0\x9F\x98\x81\xF4\x8F\xBF\xBF\xEF\xBF\xBD\"}]}",
      kLimits);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->messages[0].content.size(), 2u + 3 + 4 + 4 + 3);
}

// NUL is accepted and kept (see api.cc): no crash, no silent truncation.
TEST(ApiHostile, NulCharactersAreKept) {
  auto c = ParseChatCompletionRequest(R"({"messages":[{"role":"user","content":"a\u0000b"}],"stop":["\u0000"]})",
                                      kLimits);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->messages[0].content, std::string("a\0b", 3));
  EXPECT_EQ(c->gen.stop, std::vector<std::string>{std::string(1, '\0')});
  auto p = ParseCompletionRequest(R"({"prompt":"\u0000x"})", kLimits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->prompt_text, std::string("\0x", 2));
  auto t = ParseTokenizeRequest(R"({"content":"x\u0000"})", kLimits);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->content.size(), 2u);
  // A NUL in the model name is a 404 with a well-formed error body.
  ApiError e = ChatError(Chat(R"("model":"ti\u0000ny")"));
  EXPECT_EQ(e.status, 404);
  EXPECT_TRUE(json::accept(ErrorJson(e))) << ErrorJson(e);
}

// A raw control byte (a NUL after the object, a tab-less control inside a string) is not
// JSON: 400, never a parse that stops early at the NUL.
TEST(ApiHostile, RawControlBytesAreRefused) {
  const std::string nul_after = std::string(R"({"prompt":"x"})") + '\0' + "junk";
  EXPECT_FALSE(ParseCompletionRequest(nul_after, kLimits).ok());
  const std::string nul_inside = std::string(R"({"prompt":"x)") + '\0' + R"("})";
  EXPECT_FALSE(ParseCompletionRequest(nul_inside, kLimits).ok());
  const std::string bell = std::string(R"({"prompt":"x)") + '\x07' + R"("})";
  EXPECT_FALSE(ParseCompletionRequest(bell, kLimits).ok());
  EXPECT_TRUE(ParseCompletionRequest("{\"prompt\":\t\"x\"\r\n}", kLimits).ok());
}

// Found by api_fuzz: 1e-50 is in (0, 1] as a double and 0.0f as the float the sampler uses.
TEST(ApiHostile, TinyFloatsAreCheckedAfterConversion) {
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt":"x","top_p":1e-50})", kLimits).ok());
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt":"x","repeat_penalty":1e-50})", kLimits).ok());
  auto ok = ParseCompletionRequest(R"({"prompt":"x","top_p":1e-30})", kLimits);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_GT(ok->gen.top_p, 0.0f);
}

// Every integer field, given values no 64-bit integer holds or that are not integers:
// 400 naming the field (UBSan in the asan build would flag a float->int overflow).
TEST(ApiHostile, HugeAndWrongTypedIntegersAre400WithParam) {
  const std::vector<std::string> bad = {"1e400", "-1e400", "18446744073709551616", "-9223372036854775809",
                                        "1e300", "1.5", "\"1\"", "true", "[]", "{}", "[1]"};
  struct Field {
    std::string key, extra;
  };
  const std::vector<Field> chat = {{"max_tokens", ""}, {"max_completion_tokens", ""}, {"seed", ""}, {"top_k", ""},
                                   {"top_logprobs", R"("logprobs":true,)"}, {"n", ""}};
  for (const Field& f : chat) {
    for (const std::string& v : bad) {
      const std::string body = Chat(f.extra + "\"" + f.key + "\":" + v);
      ApiError e = ChatError(body);
      EXPECT_EQ(e.status, 400) << body;
      // 1e400 does not parse as a JSON number a double holds: the body is refused as a whole.
      if (v.find("e400") == std::string::npos) {
        EXPECT_EQ(e.param, f.key) << body << ": " << e.message;
      }
    }
  }
  for (const char* key : {"max_tokens", "seed", "top_k", "logprobs", "n", "best_of"}) {
    for (const std::string& v : bad) {
      const std::string body = std::string(R"({"prompt":"x",")") + key + "\":" + v + "}";
      auto r = ParseCompletionRequest(body, kLimits);
      ASSERT_FALSE(r.ok()) << body;
      EXPECT_EQ(r.error().status, 400) << body;
      if (v.find("e400") == std::string::npos) {
        EXPECT_EQ(r.error().param, key) << body << ": " << r.error().message;
      }
    }
  }
  for (const std::string& v : bad) {
    if (v == "[1]") continue;  // a valid prompt of one token / tokens list
    auto p = ParseCompletionRequest(R"({"prompt":[1,)" + v + "]}", kLimits);
    ASSERT_FALSE(p.ok()) << v;
    EXPECT_EQ(p.error().status, 400);
    auto d = ParseDetokenizeRequest(R"({"tokens":[1,)" + v + "]}", kLimits);
    ASSERT_FALSE(d.ok()) << v;
    EXPECT_EQ(d.error().status, 400);
    if (v.find("e400") == std::string::npos) {
      EXPECT_EQ(p.error().param, "prompt") << v;
      EXPECT_EQ(d.error().param, "tokens") << v;
    }
  }
  // The largest 64-bit values are in range for seed and out of range elsewhere.
  auto s = ParseChatCompletionRequest(Chat(R"("seed":18446744073709551615)"), kLimits);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s->gen.seed, UINT64_MAX);
  auto neg = ParseChatCompletionRequest(Chat(R"("seed":-9223372036854775808)"), kLimits);
  ASSERT_TRUE(neg.ok());
  EXPECT_EQ(ChatError(Chat(R"("max_tokens":18446744073709551615)")).param, "max_tokens");
  EXPECT_EQ(ChatError(Chat(R"("top_k":-9223372036854775808)")).param, "top_k");
}

TEST(ApiHostile, WrongTypesForEveryFieldAre400WithParam) {
  struct Field {
    std::string key;
    std::vector<std::string> bad;
  };
  const std::vector<std::string> not_number = {"\"0.5\"", "true", "[]", "{}", "[0.5]", "1e309"};
  const std::vector<std::string> not_bool = {"1", "0", "\"true\"", "[]", "{}"};
  const std::vector<Field> chat = {
      {"model", {"1", "true", "[]", "{}", "[\"tiny\"]"}},
      {"temperature", not_number},
      {"top_p", not_number},
      {"min_p", not_number},
      {"repeat_penalty", not_number},
      {"presence_penalty", not_number},
      {"frequency_penalty", not_number},
      {"stream", not_bool},
      {"logprobs", not_bool},
      {"stop", {"1", "true", "{}", "[1]", "[\"\"]", "[[\"a\"]]", "[null]"}},
      {"stream_options", {"1", "\"x\"", "[]"}},
      {"tools", {"1", "\"x\"", "{}"}},
      {"logit_bias", {"1", "\"x\"", "{\"-1\":5}", "{\"1e3\":5}", "{\" 1\":5}", "{\"\":5}", "{\"99999999999\":1}",
                      "{\"1\":101}", "{\"1\":\"5\"}", "{\"1\":true}", "[[1]]", "[[\"1\",5]]", "[[1,true]]",
                      "[[-1,false]]", "[1]"}},
  };
  for (const Field& f : chat) {
    for (const std::string& v : f.bad) {
      const std::string body = Chat("\"" + f.key + "\":" + v);
      ApiError e = ChatError(body);
      EXPECT_EQ(e.status, 400) << body;
      if (v != "1e309") {
        EXPECT_EQ(e.param, f.key) << body << ": " << e.message;
      }
    }
  }
  EXPECT_EQ(ChatError(Chat(R"("stream":true,"stream_options":{"include_usage":1})")).param,
            "stream_options.include_usage");
  for (const std::string& v : not_bool) {
    auto r = ParseCompletionRequest(R"({"prompt":"x","echo":)" + v + "}", kLimits);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().param, "echo");
  }
  for (const char* v : {"1", "true", "{}", "[\"a\",1]", "[[1]]", "[\"a\",\"b\"]", "[true]", "[1.5]"}) {
    auto r = ParseCompletionRequest(std::string(R"({"prompt":)") + v + "}", kLimits);
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_EQ(r.error().param, "prompt") << v;
  }
  for (const char* v : {"1", "true", "{}", "[\"a\"]", "[[1]]"}) {
    auto r = ParseTokenizeRequest(std::string(R"({"content":)") + v + "}", kLimits);
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_EQ(r.error().param, "content") << v;
    auto d = ParseDetokenizeRequest(std::string(R"({"tokens":)") + v + "}", kLimits);
    ASSERT_FALSE(d.ok()) << v;
    EXPECT_EQ(d.error().param, "tokens") << v;
  }
  for (const char* m : {R"([1])", R"([{"role":1,"content":"x"}])", R"([{"role":"user","content":{}}])",
                        R"([{"role":"user","content":[{"type":"image_url"}]}])",
                        R"([{"role":"user","content":[{"type":"text","text":5}]}])"}) {
    EXPECT_EQ(ChatError(std::string(R"({"messages":)") + m + "}").param.rfind("messages[0]", 0), 0u) << m;
  }
}

TEST(ApiHostile, MaxTokensZeroIsRefused) {
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    ApiError e = ChatError(Chat("\"" + std::string(key) + "\":0"));
    EXPECT_EQ(e.param, key);
    EXPECT_NE(e.message.find("at least 1"), std::string::npos) << e.message;
  }
  auto p = ParseCompletionRequest(R"({"prompt":"x","max_tokens":0})", kLimits);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().param, "max_tokens");
  EXPECT_NE(p.error().message.find("at least 1"), std::string::npos);
  auto one = ParseChatCompletionRequest(Chat(R"("max_completion_tokens":1,"max_tokens":5)"), kLimits);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->gen.max_tokens, 1);  // max_completion_tokens wins
}

TEST(ApiHostile, PromptBytesAreCappedBeforeTokenizing) {
  ApiLimits l = kLimits;
  l.max_prompt_bytes = 10;
  // Chat: the content of all messages together.
  auto fits = ParseChatCompletionRequest(
      R"({"messages":[{"role":"system","content":"12345"},{"role":"user","content":[{"type":"text","text":"67890"}]}]})",
      l);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  auto over = ParseChatCompletionRequest(
      R"({"messages":[{"role":"system","content":"12345"},{"role":"user","content":"678901"}]})", l);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().status, 400);
  EXPECT_EQ(over.error().code, "context_length_exceeded");
  EXPECT_EQ(over.error().param, "messages");
  // Completions: the prompt text.
  EXPECT_TRUE(ParseCompletionRequest(R"({"prompt":"1234567890"})", l).ok());
  auto p = ParseCompletionRequest(R"({"prompt":["12345678901"]})", l);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, "context_length_exceeded");
  EXPECT_EQ(p.error().param, "prompt");
  // Token prompts are measured in tokens against n_ctx.
  ApiLimits tiny_ctx = kLimits;
  tiny_ctx.n_ctx = 4;
  EXPECT_TRUE(ParseCompletionRequest(R"({"prompt":[1,2,3]})", tiny_ctx).ok());
  auto t = ParseCompletionRequest(R"({"prompt":[1,2,3,4]})", tiny_ctx);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, "context_length_exceeded");
  // Tokenize: the content.
  EXPECT_TRUE(ParseTokenizeRequest(R"({"content":"1234567890"})", l).ok());
  auto k = ParseTokenizeRequest(R"({"content":"12345678901"})", l);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.error().param, "content");
  EXPECT_EQ(k.error().type, "invalid_request_error");
  EXPECT_TRUE(ParseTokenizeRequest(R"({"content":"12345678901"})").ok());  // no limit
  // 0 = no limit.
  EXPECT_TRUE(ParseCompletionRequest(R"({"prompt":")" + std::string(100000, 'x') + "\"}", kLimits).ok());
}

TEST(ApiHostile, StopStringsAreBounded) {
  std::string many = "[";
  for (int i = 0; i < 1000; ++i) many += (i ? ",\"" : "\"") + std::string(300, 'a') + "\"";
  many += "]";
  ApiError e = ChatError(Chat("\"stop\":" + many));
  EXPECT_EQ(e.param, "stop");
  EXPECT_NE(e.message.find("at most 16"), std::string::npos);
  std::string sixteen = "[";
  for (int i = 0; i < kMaxStops; ++i) sixteen += (i ? ",\"" : "\"") + std::string(kMaxStopBytes, 'a') + "\"";
  sixteen += "]";
  auto ok = ParseChatCompletionRequest(Chat("\"stop\":" + sixteen), kLimits);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->gen.stop.size(), static_cast<size_t>(kMaxStops));
  EXPECT_EQ(ChatError(Chat("\"stop\":\"" + std::string(kMaxStopBytes + 1, 'a') + "\"")).param, "stop");
  EXPECT_EQ(ChatError(Chat("\"stop\":[\"a\",\"" + std::string(kMaxStopBytes + 1, 'a') + "\"]")).param, "stop");
}

TEST(ApiHostile, PenaltiesAreParsed) {
  auto r = ParseChatCompletionRequest(Chat(R"("presence_penalty":1.5,"frequency_penalty":-2)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.presence_penalty, 1.5f);
  EXPECT_EQ(r->gen.frequency_penalty, -2.0f);
  auto d = ParseCompletionRequest(R"({"prompt":"x"})", kLimits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->gen.presence_penalty, 0.0f);
  EXPECT_EQ(d->gen.frequency_penalty, 0.0f);
  EXPECT_EQ(ChatError(Chat(R"("presence_penalty":2.01)")).param, "presence_penalty");
  EXPECT_EQ(ChatError(Chat(R"("frequency_penalty":-2.5)")).param, "frequency_penalty");
}

TEST(ApiHostile, LogitBiasIsParsedInBothForms) {
  auto r = ParseChatCompletionRequest(Chat(R"("logit_bias":{"7":-100,"2":3.5,"31999":100})"), kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  using Bias = std::vector<std::pair<int32_t, float>>;
  EXPECT_EQ(r->gen.logit_bias, (Bias{{2, 3.5f}, {7, -100.0f}, {31999, 100.0f}}));
  auto a = ParseCompletionRequest(R"({"prompt":"x","logit_bias":[[5,false],[1,-2]]})", kLimits);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->gen.logit_bias, (Bias{{1, -2.0f}, {5, -100.0f}}));
  EXPECT_EQ(ChatError(Chat(R"("logit_bias":{"32000":1})")).param, "logit_bias");  // = n_vocab
  // Banning the whole vocabulary leaves nothing to sample.
  ApiLimits three = kLimits;
  three.n_vocab = 3;
  auto all = ParseChatCompletionRequest(Chat(R"("logit_bias":{"0":-100,"1":-100,"2":-100})"), three);
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.error().message.find("every token"), std::string::npos);
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("logit_bias":{"0":-100,"1":-100,"2":-99})"), three).ok());
  std::string big = "{";
  for (size_t i = 0; i <= kMaxLogitBias; ++i) big += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
  EXPECT_EQ(ChatError(Chat("\"logit_bias\":" + big + "}")).param, "logit_bias");
}

TEST(ApiHostile, UnsupportedOutputOptionsAreRefused) {
  for (const char* ok : {R"("response_format":null)", R"("response_format":{"type":"text"})", R"("tool_choice":null)",
                         R"("tool_choice":"none")", R"("tools":[])", R"("logit_bias":{})", R"("user":"u")",
                         R"("parallel_tool_calls":true)", R"("n":1)", R"("modalities":["text"])",
                         R"("store":false)", R"("metadata":{"a":"b"})", R"("function_call":"none")",
                         R"("tool_choice":"auto")", R"("function_call":"auto")", R"("functions":[{"name":"f"}])"}) {
    auto r = ParseChatCompletionRequest(Chat(ok), kLimits);
    EXPECT_TRUE(r.ok()) << ok << ": " << r.error().message;
  }
  for (const char* bad : {R"("response_format":"text")", R"("response_format":{})", R"("response_format":{"type":1})",
                          R"("response_format":{"type":"yaml"})", R"("response_format":{"type":"json_schema"})"}) {
    ApiError e = ChatError(Chat(bad));
    EXPECT_EQ(e.param.rfind("response_format", 0), 0u) << bad << ": " << e.param;
    EXPECT_NE(e.message.find("response_format"), std::string::npos) << e.message;
  }
  for (const char* bad : {R"("tool_choice":"always")", R"("tool_choice":"required")",
                          R"("tool_choice":{"type":"function","function":{"name":"f"}})", R"("tool_choice":1)"}) {
    EXPECT_EQ(ChatError(Chat(bad)).param, "tool_choice") << bad;
  }
  EXPECT_EQ(ChatError(Chat(R"("function_call":"required")")).param, "function_call");
  EXPECT_EQ(ChatError(Chat(R"("modalities":["text","audio"])")).param, "modalities");
  EXPECT_EQ(ChatError(Chat(R"("audio":{"voice":"alloy"})")).param, "audio");
  EXPECT_EQ(ChatError(Chat(R"("web_search_options":{})")).param, "web_search_options");
  EXPECT_EQ(ChatError(R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]})").param,
            "messages[0].tool_calls[0].function");
  auto p = ParseCompletionRequest(R"({"prompt":"x","response_format":{"type":"yaml"}})", kLimits);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().param, "response_format");
}

// Every field that constrains the answer's form is compiled (or refused naming itself);
// a request gets at most one, and the grammar it carries accepts what it should.
TEST(ApiConstraints, EveryDialectCompilesToAGrammar) {
  const std::tuple<const char*, const char*, const char*> cases[] = {
      {R"("response_format":{"type":"json_object"})", "response_format", "{}"},
      {R"("response_format":{"type":"json_object","schema":{"type":"integer"}})", "response_format", "1"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"integer"}}})", "response_format", "1"},
      {R"("json_schema":{"type":"integer"})", "json_schema", "1"},
      {R"("guided_json":{"type":"integer"})", "guided_json", "1"},
      {R"("guided_json":"{\"type\": \"integer\"}")", "guided_json", "1"},
      {R"("grammar":"root ::= [0-9]+")", "grammar", "1"},
      {R"("guided_grammar":"root ::= [0-9]+")", "guided_grammar", "1"},
      {R"("ebnf":"root ::= [0-9]+")", "ebnf", "1"},
      {R"("guided_choice":["1","22","333"])", "guided_choice", "1"},
      {R"("structured_outputs":{"json":{"type":"integer"}})", "structured_outputs.json", "1"},
      {R"("structured_outputs":{"choice":["7"]})", "structured_outputs.choice", "7"},
      {R"("structured_outputs":{"grammar":"root ::= \"5\""})", "structured_outputs.grammar", "5"},
      {R"("guided_regex":"\\d{3}-[a-z]+")", "guided_regex", "123-ab"},
      {R"("regex":"(yes|no)!?")", "regex", "no!"},
      {R"("structured_outputs":{"regex":"[A-Z]\\w*"})", "structured_outputs.regex", "Ab_1"},
      {R"("json_schema":{"type":"string","pattern":"^v\\d+$"})", "json_schema", "\"v12\""},
  };
  for (auto [field, param, sample] : cases) {
    auto r = ParseChatCompletionRequest(Chat(field), kLimits);
    ASSERT_TRUE(r.ok()) << field << ": " << r.error().message;
    ASSERT_TRUE(r->gen.grammar) << field;
    EXPECT_EQ(r->gen.grammar_param, param);
    EXPECT_TRUE(grammar::Matches(*r->gen.grammar, sample)) << field;
  }
  auto c = ParseCompletionRequest(R"({"prompt":"x","grammar":"root ::= \"a\""})", kLimits);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->gen.grammar);
  auto plain = ParseChatCompletionRequest(Chat(R"("response_format":{"type":"text"})"), kLimits);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->gen.grammar);
}

// A schema's properties are written in the order the client declared them (the parsed
// body sorts keys; the schema is read from the body's text), through every dialect.
TEST(ApiConstraints, SchemaPropertiesKeepTheClientsOrder) {
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"integer"}, "alpha" : {"type":"string","enum":["}{\"]"]}},)"
      R"("required":["zeta","alpha"],"additionalProperties":false})";
  for (const std::string& field : {"\"json_schema\": " + schema, "\"guided_json\":" + schema,
                                   "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"o\", \"schema\": " + schema + "}}",
                                   "\"structured_outputs\":{\"json\":" + schema + "}"}) {
    auto r = ParseChatCompletionRequest(Chat(field), kLimits);
    ASSERT_TRUE(r.ok()) << field << ": " << r.error().message;
    auto accepts = [&](std::string_view text) { return grammar::Matches(*r->gen.grammar, text); };
    EXPECT_TRUE(accepts(R"({"zeta":1,"alpha":"}{\"]"})")) << field;
    EXPECT_FALSE(accepts(R"({"alpha":"}{\"]","zeta":1})")) << field;
  }
}

TEST(ApiConstraints, BadOrConflictingConstraintsAreRefusedNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("grammar":"root ::= missing")", "grammar"},
      {R"("grammar":"root ::= root \"a\" | \"b\"")", "grammar"},
      {R"("grammar":5)", "grammar"},
      {R"~("json_schema":{"type":"string","pattern":"(?=a)"})~", "json_schema"},
      {R"("json_schema":{"type":"strin"})", "json_schema"},
      {R"("guided_json":"{not json")", "guided_json"},
      {R"("guided_choice":[])", "guided_choice"},
      {R"("guided_choice":["a",""])", "guided_choice"},
      {R"("guided_regex":"(a)\\1")", "guided_regex"},
      {R"("regex":5)", "regex"},
      {R"("structured_outputs":{"regex":"a{2,1}"})", "structured_outputs.regex"},
      {R"("structured_outputs":{"whatever":1})", "structured_outputs.whatever"},
      {R"("structured_outputs":5)", "structured_outputs"},
      {R"("guided_whitespace_pattern":" ")", "guided_whitespace_pattern"},
      {R"("grammar":"root ::= \"a\"","json_schema":{"type":"integer"})", "grammar"},
      {R"("response_format":{"type":"json_object"},"guided_choice":["a"])", "guided_choice"},
      {R"("grammar":"root ::= \"a\"","ignore_eos":true)", "ignore_eos"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","minProperties":1}}})",
       "response_format.json_schema.schema"},
  };
  for (auto [field, param] : cases) {
    ApiError e = ChatError(Chat(field));
    EXPECT_EQ(e.status, 400) << field;
    EXPECT_EQ(e.param, param) << field << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  // A hostile grammar is refused within its bounds.
  std::string deep = std::string(R"("grammar":"root ::= )") + std::string(5000, '(') + "\\\"a\\\"" + std::string(5000, ')') + "\"";
  EXPECT_EQ(ChatError(Chat(deep)).param, "grammar");
  EXPECT_EQ(ChatError(Chat(R"("grammar":")" + std::string(kMaxGrammarBytes + 1, 'a') + "\"")).param, "grammar");
}

TEST(Api, ChatTemplateKwargsReachTheTemplateAsInput) {
  auto r = ParseChatCompletionRequest(Chat(R"("chat_template_kwargs":{"enable_thinking":false,"depth":2,"who":"</s>","l":[1,"x"]})"), kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->template_kwargs.size(), 4u);
  std::map<std::string, jinja::Value> kw(r->template_kwargs.begin(), r->template_kwargs.end());
  EXPECT_EQ(kw.at("enable_thinking").kind(), jinja::Value::Kind::kBool);
  EXPECT_FALSE(kw.at("enable_thinking").b());
  EXPECT_EQ(kw.at("depth").i(), 2);
  // Strings are the client's: rendered as content, never as template text.
  ASSERT_EQ(kw.at("who").pieces().size(), 1u);
  EXPECT_TRUE(kw.at("who").pieces()[0].input);
  for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}) {
    EXPECT_EQ(ChatError(Chat(std::string(R"("chat_template_kwargs":{")") + reserved + R"(":1})")).param,
              std::string("chat_template_kwargs.") + reserved);
  }
  EXPECT_EQ(ChatError(Chat(R"("chat_template_kwargs":[1])")).param, "chat_template_kwargs");
  auto c = ParseCompletionRequest(R"({"prompt":"x","chat_template_kwargs":{"a":1}})", kLimits);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().param, "chat_template_kwargs");
}

TEST(ApiConstraints, LlamaCppGenerationFieldsAreImplementedOrRefused) {
  auto r = ParseChatCompletionRequest(Chat(R"("n_predict":7,"ignore_eos":true,"repeat_last_n":-1)"), kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->gen.max_tokens, 7);
  EXPECT_TRUE(r->gen.ignore_eos);
  EXPECT_EQ(r->gen.repeat_last_n, -1);
  r = ParseChatCompletionRequest(Chat(R"("n_predict":-1,"penalty_last_n":5)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->gen.max_tokens);
  EXPECT_EQ(r->gen.repeat_last_n, 5);
  EXPECT_EQ(ChatError(Chat(R"("n_predict":0)")).param, "n_predict");
  EXPECT_EQ(ChatError(Chat(R"("n_predict":5,"max_tokens":6)")).param, "n_predict");
  for (const char* noop : {R"("mirostat":0)", R"("typical_p":1)", R"("skip_special_tokens":true)", R"("stop_token_ids":[])",
                           R"("chat_template_kwargs":{})", R"("use_beam_search":false)", R"("n_keep":0)"}) {
    EXPECT_TRUE(ParseChatCompletionRequest(Chat(noop), kLimits).ok()) << noop;
  }
  for (auto [field, param] : std::vector<std::pair<const char*, const char*>>{
           {R"("mirostat":2)", "mirostat"}, {R"("typical_p":0.5)", "typical_p"}, {R"("dry_multiplier":0.8)", "dry_multiplier"},
           {R"("xtc_probability":0.5)", "xtc_probability"}, {R"("samplers":["top_k"])", "samplers"},
           {R"("min_tokens":3)", "min_tokens"}, {R"("stop_token_ids":[2])", "stop_token_ids"},
           {R"("skip_special_tokens":false)", "skip_special_tokens"}, {R"("n_keep":-1)", "n_keep"}}) {
    EXPECT_EQ(ChatError(Chat(field)).param, param) << field;
  }
}

// Every field is implemented, refused, or one that changes nothing: a field this server does
// not know is a 400 naming it, never dropped (the client asked for something and would get
// an answer that looks as if it had been honoured).
TEST(Api, UnknownFieldsAreRefusedNamingThem) {
  for (const char* field : {R"("frobnicate":1)", R"("verbosity":"low")", R"("top_a":0.2)", R"("echo_prompt":true)"}) {
    const ApiError e = ChatError(Chat(field));
    EXPECT_EQ(e.code, "unknown_parameter") << field;
    EXPECT_NE(e.message.find("unknown field"), std::string::npos) << e.message;
  }
  EXPECT_EQ(ChatError(Chat(R"("frobnicate":1)")).param, "frobnicate");
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("frobnicate":null)"), kLimits).ok());  // null is absent
  // The other endpoint's main field is unknown here.
  EXPECT_EQ(ChatError(Chat(R"("prompt":"p")")).param, "prompt");
  auto c = ParseCompletionRequest(R"({"prompt":"p","messages":[]})", kLimits);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().param, "messages");
  auto t = ParseTokenizeRequest(R"({"content":"a","add_bos":true})", kLimits);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().param, "add_bos");
  auto d = ParseDetokenizeRequest(R"({"tokens":[1],"skip":1})", kLimits);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().param, "skip");
  // Inside stream_options too; its error names the nested field.
  EXPECT_EQ(ChatError(Chat(R"("stream":true,"stream_options":{"include_usage":true,"x":1})")).param, "stream_options.x");
  EXPECT_EQ(ChatError(Chat(R"("stream":true,"stream_options":{"continuous_usage_stats":true})")).param,
            "stream_options.continuous_usage_stats");
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("stream":true,"stream_options":{"continuous_usage_stats":false})"), kLimits).ok());
  // A huge unknown key is clipped in the message.
  const std::string big(100000, 'k');
  const ApiError e = ChatError(Chat("\"" + big + "\":1"));
  EXPECT_LT(e.message.size(), 2000u);
}

TEST(Api, FieldsThatChangeNothingAreTaken) {
  for (const char* field :
       {R"("user":"u","metadata":{"a":"b"},"store":false,"service_tier":"auto","safety_identifier":"x")",
        R"("prompt_cache_key":"k","priority":3,"request_id":"r","prediction":{"type":"content","content":"x"})",
        R"("cache_prompt":false,"id_slot":-1,"guided_decoding_backend":"xgrammar","timings_per_token":true)",
        R"("mirostat":0,"mirostat_tau":5,"mirostat_eta":0.1,"dynatemp_range":0,"dynatemp_exponent":1)",
        R"("xtc_probability":0,"xtc_threshold":0.1,"dry_multiplier":0,"dry_base":1.75,"dry_allowed_length":2)",
        R"("dry_penalty_last_n":-1,"dry_sequence_breakers":["\n"],"return_progress":false)",
        R"("grammar_lazy":false,"grammar_triggers":[],"preserved_tokens":[],"n_indent":0,"t_max_predict_ms":0)",
        R"("min_keep":0,"lora":[],"post_sampling_probs":false,"return_tokens":false,"response_fields":[])",
        R"("return_tokens_as_token_ids":false,"stream_reasoning":true,"no_stop_trim":false,"add_special_tokens":false)"}) {
    auto r = ParseChatCompletionRequest(Chat(field), kLimits);
    EXPECT_TRUE(r.ok()) << field << ": " << (r.ok() ? "" : r.error().message);
  }
  for (auto [field, param] : std::vector<std::pair<const char*, const char*>>{
           {R"("grammar_lazy":true)", "grammar_lazy"}, {R"("grammar_triggers":[{"type":0,"value":"<"}])", "grammar_triggers"},
           {R"("preserved_tokens":["<x>"])", "preserved_tokens"}, {R"("n_indent":4)", "n_indent"},
           {R"("t_max_predict_ms":100)", "t_max_predict_ms"}, {R"("min_keep":2)", "min_keep"},
           {R"("lora":[{"id":0,"scale":1}])", "lora"}, {R"("post_sampling_probs":true)", "post_sampling_probs"},
           {R"("return_tokens_as_token_ids":true)", "return_tokens_as_token_ids"},
           {R"("stream_reasoning":false)", "stream_reasoning"}, {R"("no_stop_trim":true)", "no_stop_trim"},
           {R"("lora_path":"a")", "lora_path"}, {R"("add_special_tokens":true)", "add_special_tokens"},
           {R"("echo":true)", "echo"}}) {
    EXPECT_EQ(ChatError(Chat(field)).param, param) << field;
  }
}

// vLLM's repetition_penalty is llama.cpp's rule over the whole sequence; the reasoning
// switches of the three servers' clients; reasoning_effort for templates that read it;
// cache_salt; add_special_tokens on raw prompts.
TEST(Api, OtherServersFieldsAreImplemented) {
  auto r = ParseChatCompletionRequest(Chat(R"("repetition_penalty":1.3)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FLOAT_EQ(r->gen.repeat_penalty, 1.3f);
  EXPECT_EQ(r->gen.repeat_last_n, -1);
  r = ParseChatCompletionRequest(Chat(R"("repetition_penalty":1.3,"repeat_last_n":16)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.repeat_last_n, 16);
  EXPECT_TRUE(ParseChatCompletionRequest(Chat(R"("repetition_penalty":1.3,"repeat_penalty":1.3)"), kLimits).ok());
  EXPECT_EQ(ChatError(Chat(R"("repetition_penalty":1.3,"repeat_penalty":1.1)")).param, "repetition_penalty");
  EXPECT_EQ(ChatError(Chat(R"("repetition_penalty":0)")).param, "repetition_penalty");

  r = ParseChatCompletionRequest(Chat(R"("n":1)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_format, "");
  EXPECT_TRUE(r->include_reasoning);
  r = ParseChatCompletionRequest(Chat(R"("reasoning_format":"none")"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_format, "none");
  r = ParseChatCompletionRequest(Chat(R"("reasoning_format":"auto")"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_format, "deepseek");
  r = ParseChatCompletionRequest(Chat(R"("separate_reasoning":false)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->reasoning_format, "none");
  r = ParseChatCompletionRequest(Chat(R"("include_reasoning":false)"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->include_reasoning);
  EXPECT_EQ(ChatError(Chat(R"("reasoning_format":"deepseek-legacy")")).param, "reasoning_format");
  EXPECT_EQ(ChatError(Chat(R"("reasoning_format":"deepseek","separate_reasoning":false)")).param, "separate_reasoning");

  auto kwarg = [](const ChatCompletionRequest& q, const std::string& k) -> std::string {
    for (const auto& [key, v] : q.template_kwargs) {
      if (key == k) return v.kind() == jinja::Value::Kind::kString ? v.text() : "?";
    }
    return "";
  };
  r = ParseChatCompletionRequest(Chat(R"("reasoning_effort":"low")"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(kwarg(*r, "reasoning_effort"), "low");
  r = ParseChatCompletionRequest(Chat(R"("reasoning_effort":"low","chat_template_kwargs":{"reasoning_effort":"high"})"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(kwarg(*r, "reasoning_effort"), "high");
  EXPECT_EQ(ChatError(Chat(R"("reasoning_effort":"max")")).param, "reasoning_effort");

  r = ParseChatCompletionRequest(Chat(R"("cache_salt":"tenant-7")"), kLimits);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->gen.cache_salt, "tenant-7");
  EXPECT_EQ(ChatError(Chat(R"("cache_salt":"")")).param, "cache_salt");
  EXPECT_EQ(ChatError(Chat(R"("cache_salt":7)")).param, "cache_salt");

  auto c = ParseCompletionRequest(R"({"prompt":"p","add_special_tokens":false})", kLimits);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->add_special);
  c = ParseCompletionRequest(R"({"prompt":"p"})", kLimits);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->add_special);
}

// text_offset: byte offsets into the whole returned text, counting an echoed prompt and
// running on across stream chunks.
TEST(ApiHostile, TextOffsetsCountEchoAndEarlierChunks) {
  CompletionResponse r;
  r.endpoint = Endpoint::kCompletion;
  r.text = "Once upon a";
  r.with_logprobs = true;
  r.logprobs = {{" upon", -0.1f, {}}, {" a", -0.2f, {}}};
  r.text_offset_base = 4;  // echo of "Once"
  json j = json::parse(ResponseJson(r));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({4, 9}));
  r.text_offset_base = 0;
  EXPECT_EQ(json::parse(ResponseJson(r))["choices"][0]["logprobs"]["text_offset"], json::array({0, 5}));

  StreamChunk c;
  c.endpoint = Endpoint::kCompletion;
  c.with_logprobs = true;
  c.text_offset_base = 4;
  c.text = " upon";
  c.logprobs = {{" upon", -0.1f, {}}};
  EXPECT_EQ(json::parse(ChunkJson(c))["choices"][0]["logprobs"]["text_offset"], json::array({4}));
  StreamChunk next = c;
  next.text_offset_base = NextTextOffset(c);
  EXPECT_EQ(next.text_offset_base, 9u);
  next.text = " a time";
  next.logprobs = {{" a", -0.2f, {}}, {" time", -0.3f, {}}};
  EXPECT_EQ(json::parse(ChunkJson(next))["choices"][0]["logprobs"]["text_offset"], json::array({9, 11}));
  EXPECT_EQ(NextTextOffset(next), 16u);
}

}  // namespace
}  // namespace trellis::server

namespace trellis::server {
namespace {

const char kWeatherTool[] =
    R"({"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}})";

std::string WithTools(const std::string& extra) {
  return std::string(R"({"messages":[{"role":"user","content":"hi"}],"tools":[)") + kWeatherTool + "]" +
         (extra.empty() ? "" : "," + extra) + "}";
}

TEST(ApiTools, ToolsAndChoicesAreRead) {
  auto r = ParseChatCompletionRequest(WithTools(""), kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tools.size(), 1u);
  EXPECT_EQ(r->tools[0].name, "get_weather");
  EXPECT_EQ(r->tool_choice, ToolChoice::kAuto);  // tools without a choice: auto
  ASSERT_TRUE(r->tools[0].arguments);
  EXPECT_TRUE(grammar::Matches(*r->tools[0].arguments, R"({"city": "Oslo", "days": 3})"));
  EXPECT_FALSE(grammar::Matches(*r->tools[0].arguments, R"({"days": 3})"));
  // The template sees the tools in the client's key order (a std::map would sort them).
  EXPECT_EQ(jinja::ToJson(r->tools_value.list()[0]),
            R"({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": )"
            R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, )"
            R"("required": ["city"]}}})");
  EXPECT_EQ(r->tools[0].parameters,
            R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]})");

  auto named = ParseChatCompletionRequest(
      WithTools(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false)"), kLimits);
  ASSERT_TRUE(named.ok()) << named.error().message;
  EXPECT_EQ(named->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named->tool_choice_name, "get_weather");
  EXPECT_FALSE(named->parallel_tool_calls);
  auto none = ParseChatCompletionRequest(WithTools(R"("tool_choice":"none")"), kLimits);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->tool_choice, ToolChoice::kNone);
  EXPECT_FALSE(none->tools[0].arguments);  // nothing to hold calls to
  auto req = ParseChatCompletionRequest(WithTools(R"("tool_choice":"required")"), kLimits);
  ASSERT_TRUE(req.ok());
  EXPECT_EQ(req->tool_choice, ToolChoice::kRequired);

  // The deprecated functions / function_call.
  auto legacy = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f","parameters":{"type":"object"}}],)"
      R"("function_call":{"name":"f"}})", kLimits);
  ASSERT_TRUE(legacy.ok()) << legacy.error().message;
  EXPECT_EQ(legacy->tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(jinja::ToJson(legacy->tools_value.list()[0]),
            R"({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})");
  // No parameters: the empty parameter list.
  auto empty = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"now"}}]})", kLimits);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(grammar::Matches(*empty->tools[0].arguments, "{}"));
  EXPECT_FALSE(grammar::Matches(*empty->tools[0].arguments, R"({"a": 1})"));
}

TEST(ApiTools, BadToolsAreRefusedNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]})", "tools[0].function"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"retrieval","function":{"name":"f"}}]})", "tools[0].type"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}},)"
       R"({"type":"function","function":{"name":"f"}}]})", "tools[1].function.name"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":1}}]})",
       "tools[0].function.parameters"},
      {WithTools(R"("tool_choice":{"type":"function","function":{"name":"other"}})"), "tool_choice"},
      {WithTools(R"("tool_choice":{"type":"function"})"), "tool_choice"},
      {WithTools(R"("parallel_tool_calls":"yes")"), "parallel_tool_calls"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f",)"
       R"("parameters":{"type":"object","properties":{"n":{"type":"array","uniqueItems":true}}}}}],"tool_choice":"required"})",
       "tools[0].function.parameters"},
      {R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","strict":true,)"
       R"("parameters":{"type":"object","properties":{"n":{"type":"array","uniqueItems":true}}}}}]})",
       "tools[0].function.parameters"},
      {R"({"messages":[{"role":"user","content":"hi"},{"role":"tool","content":"x","tool_call_id":5}]})",
       "messages[1].tool_call_id"},
      {R"({"messages":[{"role":"user","content":"hi","tool_calls":[]}, {"role":"user","tool_calls":[{"function":{"name":"f"}}]}]})",
       "messages[1].tool_calls"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":5}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
      {R"({"messages":[{"role":"assistant","content":null}]})", "messages[0].content"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(ChatError(body).param, param) << body;
  // Tools on a raw prompt: refused.
  auto p = ParseCompletionRequest(R"({"prompt":"x","tools":[{"type":"function","function":{"name":"f"}}]})", kLimits);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().param, "tools");
  // auto and not strict: a schema keyword the converter lacks holds the call to any object.
  auto lax = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f",)"
      R"("parameters":{"type":"object","properties":{"n":{"type":"array","uniqueItems":true}}}}}]})", kLimits);
  ASSERT_TRUE(lax.ok()) << lax.error().message;
  EXPECT_FALSE(lax->tools[0].arguments);
}

TEST(ApiTools, ToolCallsAndResultsReachTheTemplateWithArgumentsAsObjects) {
  auto r = ParseChatCompletionRequest(
      R"({"messages":[{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
      R"("function":{"name":"f","arguments":"{\"z\": 1, \"a\": [true]}"}},)"
      R"({"id":"c2","type":"function","function":{"name":"f","arguments":"not json"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"ok"}]})", kLimits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 3u);
  const ChatMessage& a = r->messages[1];
  EXPECT_TRUE(a.content_null);
  ASSERT_EQ(a.extra.size(), 1u);
  EXPECT_EQ(a.extra[0].first, "tool_calls");
  EXPECT_EQ(jinja::ToJson(a.extra[0].second),
            R"([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": [true]}}}, )"
            R"({"id": "c2", "type": "function", "function": {"name": "f", "arguments": "not json"}}])");
  const ChatMessage& t = r->messages[2];
  EXPECT_EQ(t.role, "tool");
  EXPECT_EQ(t.content, "ok");
  ASSERT_EQ(t.extra.size(), 1u);
  EXPECT_EQ(t.extra[0].first, "tool_call_id");
}

TEST(ApiTools, ToolCallsInResponsesAndChunks) {
  CompletionResponse r;
  r.id = "x";
  r.model = "m";
  r.finish_reason = "tool_calls";
  r.tool_calls = {{"call_1", "f", R"({"a":1})"}};
  const json j = json::parse(ResponseJson(r));
  const json& m = j["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(m["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"a":1})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  StreamChunk c;
  c.tool_calls = {{"call_2", "g", "{}"}};
  c.tool_call_index = 1;
  const json d = json::parse(ChunkJson(c))["choices"][0]["delta"];
  EXPECT_EQ(d["tool_calls"][0]["index"], 1);
  EXPECT_EQ(d["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_FALSE(d.contains("content"));
}

}  // namespace
}  // namespace trellis::server
