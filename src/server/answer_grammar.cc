#include "server/answer_grammar.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "grammar/json_schema.h"

namespace trellis::server {
namespace {

using grammar::CharClass;
using grammar::Element;
using grammar::ElementKind;

Element Ref(uint32_t rule) { return Element{ElementKind::kRef, rule}; }

// How a format writes its calls: open call (between call)* close, a call being
// {"name": "<name>", "<args_key>": <arguments>}.
struct Syntax {
  std::string open, between, close;
  const char* args_key = "arguments";
};

Syntax SyntaxOf(ToolCallFormat f, bool parallel) {
  switch (f) {
    case ToolCallFormat::kHermes: return {"<tool_call>\n", parallel ? "\n</tool_call>\n<tool_call>\n" : "", "\n</tool_call>"};
    case ToolCallFormat::kLlama3: return {"", parallel ? "; " : "", "", "parameters"};
    case ToolCallFormat::kMistral: return {"[TOOL_CALLS][", parallel ? ", " : "", "]"};
    case ToolCallFormat::kPhi4: return {"<|tool_call|>[", parallel ? ", " : "", "]<|/tool_call|>"};
    case ToolCallFormat::kGeneric: break;
  }
  return {"{\"tool_calls\": [", parallel ? ", " : "", "]}"};
}

class Composer {
 public:
  explicit Composer(const grammar::GrammarLimits& limits) : b_(limits) {}

  grammar::GrammarBuilder& b() { return b_; }

  Result<std::vector<Element>> Lit(std::string_view s) {
    std::vector<Element> out;
    TRELLIS_RETURN_IF_ERROR(grammar::AppendLiteral(b_, s, out));
    return out;
  }

  // A rule with the given alternatives.
  Result<uint32_t> Rule(std::string_view base, const std::vector<std::vector<Element>>& alts) {
    TRELLIS_ASSIGN_OR_RETURN(uint32_t r, b_.NewRule(base));
    for (const auto& a : alts) TRELLIS_RETURN_IF_ERROR(b_.AddAlt(r, a));
    return r;
  }

  // Text up to and including the first `trigger` (ASCII), then `then`; with may_end the
  // text may also end before any trigger. State j: the text's longest suffix that is a
  // proper prefix of the trigger has j characters (the KMP automaton).
  Result<uint32_t> Until(std::string_view trigger, std::optional<uint32_t> then, bool may_end, std::string_view base) {
    const size_t n = trigger.size();
    std::vector<size_t> pi(n, 0);  // prefix function
    for (size_t i = 1, k = 0; i < n; ++i) {
      while (k > 0 && trigger[i] != trigger[k]) k = pi[k - 1];
      if (trigger[i] == trigger[k]) ++k;
      pi[i] = k;
    }
    auto delta = [&](size_t j, char c) {
      for (;;) {
        if (j < n && trigger[j] == c) return j + 1;
        if (j == 0) return size_t{0};
        j = pi[j - 1];
      }
    };
    std::string chars(trigger);
    std::sort(chars.begin(), chars.end());
    chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
    CharClass in;
    for (char c : chars) in.Add(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
    const uint32_t other = b_.ClassId(in.Complement());
    std::vector<uint32_t> q(n);
    for (size_t j = 0; j < n; ++j) {
      TRELLIS_ASSIGN_OR_RETURN(q[j], b_.NewRule(base));
    }
    for (size_t j = 0; j < n; ++j) {
      for (char c : chars) {
        std::vector<Element> alt = {Element{ElementKind::kClass, b_.ClassId(CharClass::Single(static_cast<unsigned char>(c)))}};
        const size_t next = delta(j, c);
        if (next < n) {
          alt.push_back(Ref(q[next]));
        } else if (then) {
          alt.push_back(Ref(*then));
        }
        TRELLIS_RETURN_IF_ERROR(b_.AddAlt(q[j], alt));
      }
      TRELLIS_RETURN_IF_ERROR(b_.AddAlt(q[j], {Element{ElementKind::kClass, other}, Ref(q[0])}));
      if (may_end) TRELLIS_RETURN_IF_ERROR(b_.AddAlt(q[j], {}));
    }
    return q[0];
  }

 private:
  grammar::GrammarBuilder b_;
};

Result<std::shared_ptr<const grammar::Grammar>> AnyObject() {
  static const Result<grammar::Grammar>* g = new Result<grammar::Grammar>(grammar::ParseGbnf(grammar::JsonObjectGbnf()));
  if (!g->ok()) return g->status();
  return std::make_shared<const grammar::Grammar>(g->value());
}

}  // namespace

Result<std::shared_ptr<const grammar::Grammar>> BuildAnswerGrammar(const AnswerSpec& spec,
                                                                    const grammar::GrammarLimits& limits) {
  const bool calls = spec.choice != ToolChoice::kNone && !spec.tools.empty();
  if (!calls && !spec.content) return std::shared_ptr<const grammar::Grammar>();
  Composer c(limits);
  auto& b = c.b();
  TRELLIS_ASSIGN_OR_RETURN(uint32_t root, b.RuleId("root"));

  std::optional<uint32_t> content;
  if (spec.content) {
    TRELLIS_ASSIGN_OR_RETURN(content, grammar::Embed(b, *spec.content, "content-"));
  }

  uint32_t body = 0;
  if (calls) {
    const Syntax syn = SyntaxOf(spec.format, spec.parallel);
    // call ::= {"name": "f", "arguments": <f's schema>} | ...
    std::vector<std::vector<Element>> objs;
    std::shared_ptr<const grammar::Grammar> any;
    for (size_t i = 0; i < spec.tools.size(); ++i) {
      const ToolGrammar& t = spec.tools[i];
      std::shared_ptr<const grammar::Grammar> args = t.arguments;
      if (!args) {
        if (!any) {
          TRELLIS_ASSIGN_OR_RETURN(any, AnyObject());
        }
        args = any;
      }
      TRELLIS_ASSIGN_OR_RETURN(uint32_t a, grammar::Embed(b, *args, fmt::format("tool{}-", i)));
      TRELLIS_ASSIGN_OR_RETURN(std::vector<Element> obj,
                               c.Lit(fmt::format("{{\"name\": \"{}\", \"{}\": ", t.name, syn.args_key)));
      obj.push_back(Ref(a));
      obj.push_back(Element{ElementKind::kClass, b.ClassId(CharClass::Single('}'))});
      objs.push_back(std::move(obj));
    }
    TRELLIS_ASSIGN_OR_RETURN(uint32_t call, c.Rule("call", objs));
    // more ::= between call more | ""   (or "" alone without parallel calls)
    std::vector<std::vector<Element>> more_alts = {{}};
    TRELLIS_ASSIGN_OR_RETURN(uint32_t more, b.NewRule("more"));
    if (!syn.between.empty()) {
      TRELLIS_ASSIGN_OR_RETURN(std::vector<Element> alt, c.Lit(syn.between));
      alt.push_back(Ref(call));
      alt.push_back(Ref(more));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(more, alt));
    }
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(more, {}));
    TRELLIS_ASSIGN_OR_RETURN(std::vector<Element> close, c.Lit(syn.close));
    // The calls after the first `skip` bytes of the opening text.
    auto calls_from = [&](size_t skip) -> Result<uint32_t> {
      TRELLIS_ASSIGN_OR_RETURN(std::vector<Element> alt, c.Lit(std::string_view(syn.open).substr(skip)));
      alt.push_back(Ref(call));
      alt.push_back(Ref(more));
      alt.insert(alt.end(), close.begin(), close.end());
      return c.Rule("calls", {alt});
    };
    TRELLIS_ASSIGN_OR_RETURN(uint32_t all_calls, calls_from(0));
    if (spec.choice != ToolChoice::kAuto) {
      body = all_calls;
    } else if (content) {
      TRELLIS_ASSIGN_OR_RETURN(body, c.Rule("answer", {{Ref(all_calls)}, {Ref(*content)}}));
    } else if (const std::string_view trigger = ToolCallTrigger(spec.format); !trigger.empty()) {
      // Free text; from the trigger on, calls.
      TRELLIS_ASSIGN_OR_RETURN(uint32_t rest, calls_from(trigger.size()));
      TRELLIS_ASSIGN_OR_RETURN(body, c.Until(trigger, rest, /*may_end=*/true, "text"));
    } else {
      // The call is the whole answer (llama3, generic): an answer opening with '{' (after
      // whitespace) is a call, any other is text.
      const uint32_t ws = b.ClassId([] {
        CharClass k = CharClass::Single(' ');
        k.Add('\t', '\n');
        k.Add('\r', '\r');
        return k;
      }());
      CharClass not_start = [] {
        CharClass k = CharClass::Single(' ');
        k.Add('\t', '\n');
        k.Add('\r', '\r');
        k.Add('{', '{');
        return k.Complement();
      }();
      TRELLIS_ASSIGN_OR_RETURN(body, b.NewRule("lead"));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(body, {Element{ElementKind::kClass, ws}, Ref(body)}));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(body, {Ref(all_calls)}));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(body, {Element{ElementKind::kClass, b.ClassId(not_start)},
                                              Element{ElementKind::kClassStar, b.ClassId(CharClass::Any())}}));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(body, {}));
    }
  } else {
    body = *content;
  }

  if (spec.reasoning == ReasoningPrefix::kNone) {
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(root, {Ref(body)}));
  } else {
    // </think>, at most two whitespace characters, then the answer.
    CharClass wsc = CharClass::Single(' ');
    wsc.Add('\t', '\n');
    wsc.Add('\r', '\r');
    TRELLIS_ASSIGN_OR_RETURN(uint32_t opt_ws, c.Rule("ws", {{Element{ElementKind::kClass, b.ClassId(wsc)}}, {}}));
    TRELLIS_ASSIGN_OR_RETURN(uint32_t after, c.Rule("after-think", {{Ref(opt_ws), Ref(opt_ws), Ref(body)}}));
    TRELLIS_ASSIGN_OR_RETURN(uint32_t think, c.Until("</think>", after, /*may_end=*/false, "think"));
    if (spec.reasoning == ReasoningPrefix::kOpen) {
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(root, {Ref(think)}));
    } else {
      TRELLIS_ASSIGN_OR_RETURN(std::vector<Element> open, c.Lit("<think>"));
      open.push_back(Ref(think));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(root, open));
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(root, {Ref(body)}));
    }
  }
  TRELLIS_ASSIGN_OR_RETURN(grammar::Grammar g, std::move(b).Build(root));
  return std::shared_ptr<const grammar::Grammar>(std::make_shared<grammar::Grammar>(std::move(g)));
}

}  // namespace trellis::server
