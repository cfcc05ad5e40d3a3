#include "server/reasoning.h"

#include <random>

#include <gtest/gtest.h>

namespace trellis::server {
namespace {

// Feeds `text` in pieces of the given sizes (cycled) and returns (reasoning, content).
std::pair<std::string, std::string> Split(ReasoningSplitter s, std::string_view text, std::vector<size_t> sizes) {
  std::string r, c;
  size_t i = 0, k = 0;
  while (i < text.size()) {
    const size_t n = std::min(sizes[k++ % sizes.size()], text.size() - i);
    auto p = s.Feed(text.substr(i, n));
    r += p.reasoning;
    c += p.content;
    i += n;
  }
  auto p = s.Flush();
  return {r + p.reasoning, c + p.content};
}

TEST(ReasoningSplitter, SplitsTheThinkBlockWhateverThePieces) {
  const std::string text = "\n<think>\nI should add 2 and 2. </thin is not the end.\n</think>\n\nThe answer is 4.";
  for (std::vector<size_t> sizes : {std::vector<size_t>{1}, {2}, {3, 1}, {7}, {100}}) {
    auto [r, c] = Split(ReasoningSplitter(true, false), text, sizes);
    EXPECT_EQ(r, "\nI should add 2 and 2. </thin is not the end.\n") << sizes[0];
    EXPECT_EQ(c, "The answer is 4.") << sizes[0];
  }
}

TEST(ReasoningSplitter, PromptThatOpensTheBlockAndOtherShapes) {
  EXPECT_TRUE(ReasoningSplitter::PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningSplitter::PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  auto [r, c] = Split(ReasoningSplitter(true, true), "thinking...</think>answer", {3});
  EXPECT_EQ(r, "thinking...");
  EXPECT_EQ(c, "answer");
  // No block: all content, leading whitespace kept.
  std::tie(r, c) = Split(ReasoningSplitter(true, false), "  plain <think> later", {2});
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "  plain <think> later");
  // A block that never closes stays reasoning.
  std::tie(r, c) = Split(ReasoningSplitter(true, false), "<think>still going </th", {4});
  EXPECT_EQ(r, "still going </th");
  EXPECT_EQ(c, "");
  // A lone "<thi" that turns out not to be the marker is content.
  std::tie(r, c) = Split(ReasoningSplitter(true, false), "<thing>", {1});
  EXPECT_EQ(c, "<thing>");
  // Disabled: everything is content.
  std::tie(r, c) = Split(ReasoningSplitter(false, false), "<think>x</think>y", {1});
  EXPECT_EQ(r, "");
  EXPECT_EQ(c, "<think>x</think>y");
}

TEST(ReasoningSplitter, NothingIsLostOrDuplicated) {
  std::mt19937 rng(3);
  const std::string alphabet = "<>/thinkab \n";
  for (int t = 0; t < 2000; ++t) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    if (rng() % 2) text = "<think>" + text;
    auto [r, c] = Split(ReasoningSplitter(true, false), text, {1 + rng() % 5});
    auto [r1, c1] = Split(ReasoningSplitter(true, false), text, {1000});
    EXPECT_EQ(r, r1) << text;
    EXPECT_EQ(c, c1) << text;
    EXPECT_LE(r.size() + c.size(), text.size());
  }
}

}  // namespace
}  // namespace trellis::server
