#include "server/tool_calls.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace trellis::server {
namespace {

std::string ReadTemplate(const std::string& name) {
  std::ifstream in(std::string(TRELLIS_TEST_DATA) + "/templates/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
    const std::string src = ReadTemplate(file);
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

}  // namespace
}  // namespace trellis::server
