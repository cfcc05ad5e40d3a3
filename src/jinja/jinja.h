// A Jinja interpreter for chat templates: renders a GGUF's tokenizer.chat_template the way
// Hugging Face's apply_chat_template does (jinja2 with trim_blocks and lstrip_blocks on,
// the loopcontrols extension, tojson with ensure_ascii off, raise_exception and
// strftime_now as globals).
//
// What it covers is what real chat templates use: text with {{ }}, {% %} and {# #} tags and
// their whitespace control ('-'); if / elif / else, for (tuple targets, a loop filter,
// else, loop.index/index0/revindex/first/last/length/previtem/nextitem, break, continue),
// set (a name, a namespace attribute, a block), macro (with defaults) and calls,
// generation (HF's, rendered as its body); expressions with Python precedence, the
// conditional expression, literals (strings, numbers, lists, dicts, tuples), attribute and
// subscript access, slices, filters, tests, the string / list / dict methods templates
// call (strip, split, startswith, replace, items, get, append, ...), and the globals
// range, namespace, dict, raise_exception and strftime_now. Anything else is an error
// naming the template line and the construct, at parse time where it can be seen there.
//
// Provenance: every string carries, per piece, whether it came from the caller's input
// (a message's content) or from the template. Rendering returns the output as pieces, so
// the caller can let control-token texts become control tokens only where the template
// wrote them (chat_template.h). Operations that keep pieces apart (concatenation, ~,
// join, trim, upper, lower, macros) keep them; others (replace, split, slices, format)
// make one piece that counts as input if any part was.
//
// Hostile templates (they come from model files): the source size, expression nesting,
// macro recursion, loop iterations and output size are bounded, every failure is a
// Status, never a crash or a hang.
//
// Thread safety: a parsed Template is immutable; Render may run concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trellis::jinja {

// A run of output text and where it came from.
struct Piece {
  std::string text;
  bool input = false;  // true: from the caller's input values, false: written by the template
};

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, as Python's dict

// A Jinja value: undefined, none, bool, int, float, string (pieces), list, dict, or a
// callable (builtins and macros). Lists and dicts are shared by reference, as in Python.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };
  struct Callable;

  Value() = default;
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s, bool input = false);
  static Value Pieces(std::vector<Piece> p);
  static Value List(ValueList items = {});
  static Value Dict(ValueDict items = {});

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  // The string's text (for a string), joined.
  std::string text() const;
  const std::vector<Piece>& pieces() const { return *str_; }
  ValueList& list() const { return *list_; }
  ValueDict& dict() const { return *dict_; }
  const Callable& callable() const { return *fn_; }
  bool b() const { return b_; }
  int64_t i() const { return i_; }
  double f() const { return f_; }
  // Dict lookup; nullptr if absent or not a dict.
  const Value* Find(std::string_view key) const;
  // Dict insert or replace.
  void Set(const std::string& key, Value v) const;

  static Value MakeCallable(std::shared_ptr<const Callable> fn);

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<std::vector<Piece>> str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Callable> fn_;
};

struct Node;

class Template {
 public:
  // Parses a template. InvalidArgument naming the line and the construct on a syntax
  // error or a tag/filter/test this interpreter does not have.
  static Result<Template> Parse(std::string_view source);

  // Renders with `globals` (a dict value: messages, bos_token, add_generation_prompt, ...)
  // on top of the builtins. InvalidArgument with the line for a runtime error, and the
  // template's own message for raise_exception.
  Result<std::vector<Piece>> Render(const Value& globals) const;

  // Limits (hostile templates).
  static constexpr size_t kMaxSourceBytes = 1 << 20;
  static constexpr size_t kMaxOutputBytes = 16 << 20;
  static constexpr int kMaxDepth = 200;
  static constexpr int64_t kMaxLoopIterations = 1 << 20;

 private:
  std::shared_ptr<const Node> root_;
};

// JSON of a value as Python's json.dumps(ensure_ascii=False) writes it (", " and ": "
// separators, or indent), for tojson. Exposed for tests.
std::string ToJson(const Value& v, int indent = -1);

}  // namespace trellis::jinja
