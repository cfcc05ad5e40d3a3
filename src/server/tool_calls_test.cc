#include "server/tool_calls.h"

#include "grammar/json_schema.h"
#include "grammar/stacks.h"
#include "server/answer_grammar.h"
#include "util/test_files.h"


#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace trellis::server {
namespace {

TEST(ToolCalls, FormatIsDetectedFromTheRealTemplates) {
  const std::pair<const char*, ToolCallFormat> cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::kHermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", ToolCallFormat::kLlama3},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolCallFormat::kMistral},
      {"TinyLlama-1.1B-Chat-v1.0.jinja", ToolCallFormat::kGeneric},
      {"google-gemma-2-2b-it.jinja", ToolCallFormat::kGeneric},
      {"microsoft-Phi-3.5-mini-instruct.jinja", ToolCallFormat::kGeneric},
  };
  for (auto [file, want] : cases) {
    const std::string src = trellis::testing::ReadTestData(std::string("templates/") + file);
    ASSERT_FALSE(src.empty()) << file;
    EXPECT_EQ(DetectToolCallFormat(src), want) << file << " -> " << ToolCallFormatName(DetectToolCallFormat(src));
  }
}

TEST(ToolCalls, HermesBlocksWithContentAroundAndParallelCalls) {
  auto a = ParseToolCalls(ToolCallFormat::kHermes,
                          "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                          "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": \"{\\\"tz\\\": "
                          "\\\"CET\\\"}\"}\n</tool_call>");
  EXPECT_EQ(a.content, "Let me check.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris","unit":"c"})");  // the model's key order
  EXPECT_EQ(a.calls[1].name, "time");
  EXPECT_EQ(a.calls[1].arguments, R"({"tz":"CET"})");  // arguments given as a JSON string
  // A block cut off by the end of generation still parses when its JSON is whole.
  a = ParseToolCalls(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, "{}");
  // Blocks that are not calls stay text; no call is invented.
  for (const char* bad : {"<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", "<tool_call>[1, 2]</tool_call>",
                          "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
                          "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>"}) {
    a = ParseToolCalls(ToolCallFormat::kHermes, bad);
    EXPECT_TRUE(a.calls.empty()) << bad;
    EXPECT_EQ(a.content, bad);
  }
  a = ParseToolCalls(ToolCallFormat::kHermes, "  just text  ");
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.content, "just text");
}

TEST(ToolCalls, Llama3JsonCalls) {
  auto a = ParseToolCalls(ToolCallFormat::kLlama3, R"({"name": "search", "parameters": {"q": "a;b"}})");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "search");
  EXPECT_EQ(a.calls[0].arguments, R"({"q":"a;b"})");  // a ';' inside a string is not a separator
  EXPECT_EQ(a.content, "");
  a = ParseToolCalls(ToolCallFormat::kLlama3,
                     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": 1}}");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[1].name, "b");
  EXPECT_EQ(a.calls[1].arguments, R"({"x":1})");
  // Prose, or JSON that is not a call, is content.
  for (const char* text : {"The answer is {\"name\": 1}.", R"({"city": "Paris"})", R"({"name": "a", "parameters": {}}; nonsense)"}) {
    a = ParseToolCalls(ToolCallFormat::kLlama3, text);
    EXPECT_TRUE(a.calls.empty()) << text;
    EXPECT_EQ(a.content, text);
  }
}

TEST(ToolCalls, MistralPhi4AndGeneric) {
  auto a = ParseToolCalls(ToolCallFormat::kMistral,
                          R"(Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}])");
  EXPECT_EQ(a.content, "Sure.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(a.calls[1].name, "g");
  a = ParseToolCalls(ToolCallFormat::kPhi4, R"(<|tool_call|>[{"name": "f", "arguments": {"k": [1]}}]<|/tool_call|>)");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"k":[1]})");
  a = ParseToolCalls(ToolCallFormat::kGeneric, R"({"tool_calls": [{"name": "f", "arguments": {"z": true}}]})");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"z":true})");
  a = ParseToolCalls(ToolCallFormat::kGeneric, R"({"answer": 42})");
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.content, R"({"answer": 42})");
  a = ParseToolCalls(ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"f\"");
  EXPECT_TRUE(a.calls.empty());
  EXPECT_EQ(a.content, "[TOOL_CALLS][{\"name\": \"f\"");
  EXPECT_EQ(ToolCallTrigger(ToolCallFormat::kHermes), "<tool_call>");
  EXPECT_EQ(ToolCallTrigger(ToolCallFormat::kLlama3), "");
}


// ---- streaming -----------------------------------------------------------------------

// Feeds `text` one byte at a time; returns what was sent and the end.
std::pair<std::string, ToolCallStream::End> StreamBytes(ToolCallFormat f, std::string_view text) {
  ToolCallStream s(f);
  std::string sent;
  for (char c : text) sent += s.Feed(std::string_view(&c, 1));
  return {sent, s.Finish()};
}

TEST(ToolCallStream, ContentPassesUntilTheTriggerAndCallsAreParsedAtTheEnd) {
  auto [sent, end] = StreamBytes(ToolCallFormat::kHermes,
                                 "Let me check. <tool_c is not it.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
  EXPECT_EQ(sent, "Let me check. <tool_c is not it.\n");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].name, "f");
  EXPECT_EQ(end.calls[0].arguments, "{\"a\":1}");
  EXPECT_EQ(end.content, "");
}

TEST(ToolCallStream, HeldTextThatIsNoCallIsContentAfterAll) {
  auto [sent, end] = StreamBytes(ToolCallFormat::kHermes, "a <tool_call> not json");
  EXPECT_EQ(sent + end.content, "a <tool_call> not json");
  EXPECT_TRUE(end.calls.empty());
  // A text that ends inside what could have been the trigger.
  auto [sent2, end2] = StreamBytes(ToolCallFormat::kHermes, "x <tool");
  EXPECT_EQ(sent2 + end2.content, "x <tool");
}

TEST(ToolCallStream, WholeAnswerFormatsDecideOnTheFirstCharacter) {
  auto [sent, end] = StreamBytes(ToolCallFormat::kLlama3, "  {\"name\": \"f\", \"parameters\": {}}");
  EXPECT_EQ(sent, "");
  ASSERT_EQ(end.calls.size(), 1u);
  auto [sent2, end2] = StreamBytes(ToolCallFormat::kGeneric, " Hello {not a call}");
  EXPECT_EQ(sent2 + end2.content, " Hello {not a call}");
  EXPECT_TRUE(end2.calls.empty());
  EXPECT_EQ(sent2.size(), std::string(" Hello {not a call}").size());  // streamed, not held
  // Disabled: everything passes.
  ToolCallStream off;
  EXPECT_EQ(off.Feed("<tool_call>"), "<tool_call>");
}

// Streamed calls: fed a byte at a time, each call's name comes once, first, and its
// argument pieces put together are the arguments the whole answer parses to, in every
// format, with arguments that hold a "name" key, braces in strings, escapes and UTF-8.
TEST(ToolCallStream, CallsStreamAsNameThenArgumentPieces) {
  const std::string args1 = R"({"name": "x{\"}", "deep": {"name": [1, {"a": "é€"}]}})";
  const std::string args2 = R"({"q": "]"})";
  const std::pair<ToolCallFormat, std::string> cases[] = {
      {ToolCallFormat::kHermes, "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": " + args1 +
                                     "}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": " + args2 +
                                     "}\n</tool_call>"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": " + args1 + "}, {\"name\": \"g\", \"arguments\": " +
                                      args2 + "}]"},
      {ToolCallFormat::kLlama3, "{\"name\": \"f\", \"parameters\": " + args1 + "}; {\"name\": \"g\", \"parameters\": " + args2 + "}"},
      {ToolCallFormat::kGeneric, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": " + args1 + "}, {\"name\": \"g\", \"arguments\": " +
                                      args2 + "}]}"},
      {ToolCallFormat::kPhi4, "<|tool_call|>[{\"name\": \"f\", \"arguments\": " + args1 + "}, {\"name\": \"g\", \"arguments\": " +
                                   args2 + "}]<|/tool_call|>"},
  };
  for (const auto& [format, text] : cases) {
    SCOPED_TRACE(ToolCallFormatName(format));
    const ParsedAnswer whole = ParseToolCalls(format, text);
    ASSERT_EQ(whole.calls.size(), 2u) << text;
    ToolCallStream s(format);
    std::string content;
    std::vector<std::string> names, args(2);
    auto take = [&] {
      for (ToolCallStream::CallPiece& p : s.TakeCallPieces()) {
        ASSERT_LT(p.index, 2u);
        if (p.first) {
          ASSERT_EQ(names.size(), p.index);  // announced once, in order, before its arguments
          names.push_back(p.name);
        } else {
          ASSERT_LT(p.index, names.size());
        }
        args[p.index] += p.arguments;
      }
    };
    for (char c : text) {
      content += s.Feed(std::string_view(&c, 1));
      take();
    }
    ToolCallStream::End end = s.Finish();
    take();
    EXPECT_TRUE(end.calls.empty());  // all sent as pieces
    EXPECT_TRUE(s.streamed_calls() && s.streamed_calls_complete());
    std::string all = content + end.content;  // streamed content is not trimmed; the whole answer's is
    all.erase(all.find_last_not_of(" \n") + 1);
    EXPECT_EQ(all, whole.content);
    ASSERT_EQ(names.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(names[k], whole.calls[k].name);
      EXPECT_EQ(nlohmann::ordered_json::parse(args[k]).dump(), whole.calls[k].arguments) << args[k];
    }
  }
  // A call cut short streams what was written; the name waits until it is whole.
  ToolCallStream cut(ToolCallFormat::kHermes);
  cut.Feed("<tool_call>\n{\"name\": \"lo");
  EXPECT_TRUE(cut.TakeCallPieces().empty());
  cut.Feed("ng\", \"arguments\": {\"a\": \"\xC3");  // half of a UTF-8 character
  auto pieces = cut.TakeCallPieces();
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].name, "long");
  EXPECT_EQ(pieces[1].arguments, "{\"a\": \"");
  cut.Finish();
  EXPECT_TRUE(cut.streamed_calls() && !cut.streamed_calls_complete());
  pieces = cut.TakeCallPieces();
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].arguments, "\xC3");
}

// ---- the answer grammar --------------------------------------------------------------

std::shared_ptr<const grammar::Grammar> Schema(const char* s) {
  auto g = grammar::CompileJsonSchema(s);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::make_shared<grammar::Grammar>(std::move(*g));
}

std::shared_ptr<const grammar::Grammar> Build(const AnswerSpec& spec) {
  auto g = BuildAnswerGrammar(spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

AnswerSpec WeatherSpec(ToolCallFormat f, ToolChoice choice) {
  AnswerSpec spec;
  spec.format = f;
  spec.choice = choice;
  spec.tools = {{"get_weather", Schema(R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})")},
                {"now", nullptr}};
  return spec;
}

TEST(AnswerGrammar, RequiredCallsInEachFormat) {
  const std::pair<ToolCallFormat, std::string> calls[] = {
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
      {ToolCallFormat::kLlama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"},
      {ToolCallFormat::kPhi4, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]<|/tool_call|>"},
      {ToolCallFormat::kGeneric, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}"},
  };
  for (const auto& [f, text] : calls) {
    auto g = Build(WeatherSpec(f, ToolChoice::kRequired));
    ASSERT_TRUE(g);
    EXPECT_TRUE(grammar::Matches(*g, text)) << ToolCallFormatName(f) << ": " << text;
    // What the grammar admits, the parser reads back.
    ParsedAnswer a = ParseToolCalls(f, text);
    ASSERT_EQ(a.calls.size(), 1u) << ToolCallFormatName(f);
    EXPECT_EQ(a.calls[0].arguments, "{\"city\":\"Paris\"}");
    // Arguments outside the schema, an unknown tool, free text: refused.
    std::string bad = text;
    bad.replace(bad.find("city"), 4, "town");
    EXPECT_FALSE(grammar::IsPrefix(*g, bad)) << bad;
    std::string unknown = text;
    unknown.replace(unknown.find("get_weather"), 11, "get_wealth!");
    EXPECT_FALSE(grammar::IsPrefix(*g, unknown)) << unknown;
    EXPECT_FALSE(grammar::IsPrefix(*g, "Sure, ")) << ToolCallFormatName(f);
  }
}

TEST(AnswerGrammar, ParallelCallsOnlyWhenAllowed) {
  AnswerSpec spec = WeatherSpec(ToolCallFormat::kHermes, ToolChoice::kRequired);
  const std::string two =
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  EXPECT_TRUE(grammar::Matches(*Build(spec), two));
  EXPECT_EQ(ParseToolCalls(ToolCallFormat::kHermes, two).calls.size(), 2u);
  spec.parallel = false;
  EXPECT_FALSE(grammar::Matches(*Build(spec), two));
  EXPECT_TRUE(grammar::Matches(*Build(spec), "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
}

TEST(AnswerGrammar, AutoIsFreeTextUntilACallBegins) {
  auto g = Build(WeatherSpec(ToolCallFormat::kHermes, ToolChoice::kAuto));
  ASSERT_TRUE(g);
  EXPECT_TRUE(grammar::Matches(*g, ""));
  EXPECT_TRUE(grammar::Matches(*g, "Just text, with <tags> and <tool_ca and << <tool_cal."));
  EXPECT_TRUE(grammar::Matches(*g, "Checking.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  // Once the trigger is written, only a valid call may follow.
  EXPECT_FALSE(grammar::IsPrefix(*g, "x <tool_call>\nhello"));
  EXPECT_FALSE(grammar::Matches(*g, "x <tool_call>\n{\"name\": \"now\", \"arguments\": {}}"));  // unclosed
  EXPECT_FALSE(grammar::IsPrefix(*g, "<<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"x\""));

  // Formats whose call is the whole answer: '{' opens a call.
  auto l = Build(WeatherSpec(ToolCallFormat::kLlama3, ToolChoice::kAuto));
  EXPECT_TRUE(grammar::Matches(*l, "The weather is fine {really}."));
  EXPECT_TRUE(grammar::Matches(*l, " {\"name\": \"now\", \"parameters\": {}}"));
  EXPECT_FALSE(grammar::IsPrefix(*l, "{\"nome\""));

  // With a content constraint: a call, or that content.
  AnswerSpec spec = WeatherSpec(ToolCallFormat::kHermes, ToolChoice::kAuto);
  spec.content = Schema(R"({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})");
  auto c = Build(spec);
  EXPECT_TRUE(grammar::Matches(*c, "{\"answer\": 4}"));
  EXPECT_TRUE(grammar::Matches(*c, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(grammar::IsPrefix(*c, "The answer"));
}

TEST(AnswerGrammar, ReasoningComesFirstThenTheConstrainedAnswer) {
  AnswerSpec spec;
  spec.content = Schema(R"({"enum": ["yes", "no"]})");
  spec.reasoning = ReasoningPrefix::kOptional;
  auto g = Build(spec);
  EXPECT_TRUE(grammar::Matches(*g, "\"yes\""));
  EXPECT_TRUE(grammar::Matches(*g, "<think>\nIs it? </thin </think < yes.\n</think>\n\n\"no\""));
  EXPECT_FALSE(grammar::IsPrefix(*g, "<think>x</think>\n\nmaybe"));
  EXPECT_FALSE(grammar::Matches(*g, "<think>never closed"));
  spec.reasoning = ReasoningPrefix::kOpen;  // the prompt opened the block
  auto o = Build(spec);
  EXPECT_TRUE(grammar::Matches(*o, "thinking...</think>\"yes\""));
  EXPECT_FALSE(grammar::Matches(*o, "\"yes\""));
  // Nothing to constrain: no grammar.
  AnswerSpec none;
  none.reasoning = ReasoningPrefix::kOptional;
  auto n = BuildAnswerGrammar(none);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, nullptr);
}

}  // namespace
}  // namespace trellis::server
