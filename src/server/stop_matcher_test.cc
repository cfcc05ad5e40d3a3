#include "server/stop_matcher.h"

#include <random>

#include <gtest/gtest.h>

namespace trellis::server {
namespace {

// Feeds `pieces` and returns everything emitted.
std::string Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += m.Push(p);
  return out + m.Flush();
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.held(), 0u);
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, StopInsideOnePiece) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("hello END world"), "hello ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("more"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, StopSpanningPieces) {
  StopMatcher m({"\n\nUser:"});
  EXPECT_EQ(m.Push("Sure."), "Sure.");
  EXPECT_EQ(m.Push("\n"), "");  // could be the start of the stop
  EXPECT_EQ(m.Push("\nUs"), "");
  EXPECT_EQ(m.held(), 4u);
  EXPECT_EQ(m.Push("er: hi"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "\n\nUser:");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ST"), "");
  EXPECT_EQ(m.Push("AR"), "STAR");
  EXPECT_EQ(m.Push("S"), "");
  EXPECT_EQ(m.Flush(), "S");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStops) {
  StopMatcher m({"xyz", "b"});
  EXPECT_EQ(Feed(m, {"a", "xy", "zb"}), "a");
  StopMatcher m2({"abc", "bc"});
  EXPECT_EQ(Feed(m2, {"zab", "c"}), "z");  // same end: the longer one
  StopMatcher m3({"abcd", "bc"});
  EXPECT_EQ(Feed(m3, {"abcd"}), "a");  // "bc" completes first
}

TEST(StopMatcher, OverlappingPrefix) {
  // "aab" in "aaab": the held tail must be re-examined, not dropped.
  StopMatcher m({"aab"});
  EXPECT_EQ(Feed(m, {"a", "a", "a", "b", "tail"}), "a");
}

// Property: whatever the split, output = text up to the first stop occurrence.
TEST(StopMatcher, RandomSplitsMatchReference) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab\n:";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int ns = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < ns; ++s) {
      std::string st;
      const int len = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < len; ++i) st += alphabet[rng() % alphabet.size()];
      stops.push_back(st);
    }
    size_t first = std::string::npos, best_end = std::string::npos;
    std::string matched;
    for (const auto& s : stops) {
      const size_t pos = text.find(s);
      if (pos != std::string::npos && (pos + s.size() < best_end || (pos + s.size() == best_end && pos < first))) {
        best_end = pos + s.size();
        first = pos;
        matched = s;
      }
    }
    const std::string want = first == std::string::npos ? text : text.substr(0, first);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t len = 1 + rng() % 5;
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    StopMatcher m(stops);
    ASSERT_EQ(Feed(m, pieces), want) << "text '" << text << "' stop0 '" << stops[0] << "'";
    ASSERT_EQ(m.stopped(), first != std::string::npos);
    ASSERT_EQ(m.matched(), matched);
  }
}

}  // namespace
}  // namespace trellis::server
