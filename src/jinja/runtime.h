// The renderer: walks a parsed tree (ast.h) over Values with jinja2's semantics and writes
// the output as pieces that keep their provenance (jinja.h). Internal to src/jinja; a
// Template's Render makes one Renderer per call.
//
// A render is bounded (jinja.h, "Hostile templates"): output bytes, loop iterations,
// evaluation depth and macro recursion are counted here, and a render past one of their
// limits fails with InvalidArgument naming the template line.
//
// The member functions are defined in three files:
//   runtime.cc  the builtins, statements, expressions, calls and operators
//   methods.cc  the str / dict / list methods templates call (s.strip(), d.items(),
//               l.append(), ...) and the string helpers the filters share
//   filters.cc  filters (x|trim, x|tojson, ...) and tests (x is defined, ...)
//
// Thread safety: a Renderer belongs to one thread; the tree it walks is read only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/jinja.h"
#include "util/status.h"

namespace trellis::jinja {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  // The builtins (range, namespace, dict, raise_exception, strftime_now) with `globals`
  // (a dict) on top.
  explicit Renderer(const Value& globals);

  // Renders the template `root` into *out.
  Status Run(const Node& root, std::vector<Piece>* out);

 private:
  using Scope = std::unordered_map<std::string, Value>;
  using Args = std::vector<Value>;
  using Kwargs = std::vector<std::pair<std::string, Value>>;

  // runtime.cc
  Status Err(const Node& n, const std::string& what) const;
  void Emit(const Value& v);
  void EmitPiece(const std::string& s, bool input);
  const Value* Lookup(const std::string& name) const;
  Value Fn(std::function<Result<Value>(Args&, Kwargs&)> f);
  void Builtins();
  // statements
  Status Exec(const Node& n, Flow* flow);
  Result<Value> Capture(const Node& body);
  Value MakeMacro(const Node& n);
  Result<ValueList> Iterate(const Node& at, const Value& v);
  Status ExecFor(const Node& n, Flow* flow);
  // expressions
  Result<Value> Eval(const Node& n);
  Result<Value> EvalInner(const Node& n);
  Result<Value> GetAttr(const Value& o, const std::string& name);
  Result<Value> GetItem(const Node& n, const Value& o, const Value& k);
  Result<Value> EvalSlice(const Node& n);
  Result<std::pair<Args, Kwargs>> EvalArgs(const Node& n, size_t first);
  Result<Value> EvalCall(const Node& n);
  Result<Value> Invoke(const Node& n, const Value& f, Args& a, Kwargs& kw);
  static size_t ToTextSize(const Value& v);
  static void AppendPieces(std::vector<Piece>& out, const Value& v);
  Result<Value> EvalBinary(const Node& n);

  // methods.cc
  static void StripRange(std::string_view s, const std::string* chars, bool left, bool right, size_t& b, size_t& e);
  static std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right);
  static Value StripPieces(const Value& v, const std::string* chars, bool left, bool right);
  static Value MapPieces(const Value& v, const std::function<std::string(const std::string&)>& f);
  static std::string Upper(const std::string& s);
  static std::string Lower(const std::string& s);
  static std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
  Result<Value> CallMethod(const Node& n, const Value& o, const std::string& m, Args& a, Kwargs& kw);

  // filters.cc
  Result<bool> EvalTest(const Node& n);
  static Value ItemAttr(const Value& item, const std::string& path);
  const Value* Kw(Kwargs& kw, const char* name);
  Result<Value> EvalFilter(const Node& n);
  static size_t CodepointCount(const std::string& s);
  static bool ContainsInput(const Value& v);

  std::vector<Scope> scopes_;
  std::vector<Piece>* out_ = nullptr;
  size_t out_bytes_ = 0;
  int64_t iterations_ = 0;
  int eval_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace trellis::jinja
