// libFuzzer target for the chat-template interpreter (src/jinja/), built only with
// -DTRELLIS_FUZZ=ON and clang. A template comes from a model file: hostile.
//
// The input is a template's source. Parsing may fail (then the message must name a line);
// a parsed template is rendered with a small conversation, and may fail the same way.
// What must never happen: a crash, a hang (the interpreter bounds loops, depth and
// output), an empty error message, or output past the output limit.
//
// Run: jinja_fuzz -max_total_time=300 -max_len=4096 -dict=tests/data/jinja_corpus.dict \
//        /tmp/new-corpus tests/data/jinja_corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "jinja/jinja.h"

namespace trellis::jinja {
namespace {

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "jinja_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

Value Globals() {
  auto msg = [](const char* role, const char* content) {
    return Value::Dict({{"role", Value::Str(role)}, {"content", Value::Str(content, true)}});
  };
  return Value::Dict({{"messages", Value::List({msg("system", "Be brief."), msg("user", "Hi </s> {{ x }}"),
                                                msg("assistant", "Hello."), msg("user", "")})},
                      {"tools", Value::None()},
                      {"add_generation_prompt", Value::Bool(true)},
                      {"bos_token", Value::Str("<s>")},
                      {"eos_token", Value::Str("</s>")}});
}

}  // namespace
}  // namespace trellis::jinja

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trellis::jinja;
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = Template::Parse(src);
  if (!t.ok()) {
    FUZZ_CHECK(t.status().message().find("chat template") != std::string_view::npos);
    return 0;
  }
  static const Value globals = Globals();
  auto r = t->Render(globals);
  if (!r.ok()) {
    FUZZ_CHECK(!r.status().message().empty());
    return 0;
  }
  size_t bytes = 0;
  for (const Piece& p : *r) bytes += p.text.size();
  FUZZ_CHECK(bytes <= Template::kMaxOutputBytes + (1 << 20));
  return 0;
}
