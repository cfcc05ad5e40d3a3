#include "grammar/grammar.h"

#include <algorithm>

#include <fmt/format.h>
#include <xxhash.h>

namespace trellis::grammar {

namespace {
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;
}  // namespace

// ---- CharClass ----

CharClass CharClass::Range(uint32_t lo, uint32_t hi) {
  CharClass c;
  c.Add(lo, hi);
  return c;
}

void CharClass::Add(uint32_t lo, uint32_t hi) {
  ranges_.emplace_back(lo, std::min(hi, kMaxCodePoint));
  Normalize();
}

void CharClass::Add(const CharClass& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  Normalize();
}

void CharClass::Normalize() {
  // Cut surrogates out, then sort and merge overlapping or adjacent ranges.
  std::vector<std::pair<uint32_t, uint32_t>> in;
  in.reserve(ranges_.size() + 1);
  for (auto [lo, hi] : ranges_) {
    if (lo > hi) continue;
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      in.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateLo) in.emplace_back(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) in.emplace_back(kSurrogateHi + 1, hi);
  }
  std::sort(in.begin(), in.end());
  ranges_.clear();
  for (auto r : in) {
    if (!ranges_.empty() && r.first <= ranges_.back().second + 1) {
      ranges_.back().second = std::max(ranges_.back().second, r.second);
    } else {
      ranges_.push_back(r);
    }
  }
}

CharClass CharClass::Complement() const {
  CharClass c;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges_) {
    if (lo > next) c.ranges_.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) c.ranges_.emplace_back(next, kMaxCodePoint);
  c.Normalize();
  return c;
}

bool CharClass::Contains(uint32_t cp) const { return Intersects(cp, cp); }

bool CharClass::Intersects(uint32_t lo, uint32_t hi) const {
  // First range ending at or after lo.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), lo,
                             [](const std::pair<uint32_t, uint32_t>& r, uint32_t v) { return r.second < v; });
  return it != ranges_.end() && it->first <= hi;
}

// ---- GrammarBuilder ----

Result<uint32_t> GrammarBuilder::RuleId(std::string_view name) {
  auto it = std::lower_bound(names_.begin(), names_.end(), name,
                             [](const std::pair<std::string, uint32_t>& e, std::string_view n) { return e.first < n; });
  if (it != names_.end() && it->first == name) return it->second;
  if (g_.rules.size() >= limits_.max_rules) {
    return InvalidArgument(fmt::format("grammar has more than {} rules", limits_.max_rules));
  }
  const auto id = static_cast<uint32_t>(g_.rules.size());
  g_.rules.push_back(Rule{std::string(name), {}});
  defined_.push_back(false);
  names_.insert(it, {std::string(name), id});
  return id;
}

Result<uint32_t> GrammarBuilder::NewRule(std::string_view base) {
  for (size_t i = g_.rules.size();; ++i) {
    const std::string name = fmt::format("{}-{}", base, i);
    auto it = std::lower_bound(names_.begin(), names_.end(), name,
                               [](const std::pair<std::string, uint32_t>& e, std::string_view n) { return e.first < n; });
    if (it != names_.end() && it->first == name) continue;
    TRELLIS_ASSIGN_OR_RETURN(uint32_t id, RuleId(name));
    MarkDefined(id);
    return id;
  }
}

uint32_t GrammarBuilder::ClassId(const CharClass& c) {
  // Linear search over recent classes keeps literals from multiplying classes; grammars
  // have few distinct classes.
  const size_t from = g_.classes.size() > 256 ? g_.classes.size() - 256 : 0;
  for (size_t i = from; i < g_.classes.size(); ++i) {
    if (g_.classes[i] == c) return static_cast<uint32_t>(i);
  }
  g_.classes.push_back(c);
  return static_cast<uint32_t>(g_.classes.size() - 1);
}

Status GrammarBuilder::AddAlt(uint32_t rule, const std::vector<Element>& alt) {
  if (g_.elements.size() + alt.size() + 1 > limits_.max_elements) {
    return InvalidArgument(fmt::format("grammar has more than {} elements", limits_.max_elements));
  }
  g_.rules[rule].alts.push_back(static_cast<uint32_t>(g_.elements.size()));
  g_.elements.insert(g_.elements.end(), alt.begin(), alt.end());
  g_.elements.push_back(Element{ElementKind::kEnd, 0});
  defined_[rule] = true;
  return Status::Ok();
}

Result<Grammar> GrammarBuilder::Build(uint32_t root) && {
  for (size_t r = 0; r < g_.rules.size(); ++r) {
    if (!defined_[r]) return InvalidArgument(fmt::format("grammar rule '{}' is used but never defined", g_.rules[r].name));
  }
  g_.root = root;
  TRELLIS_RETURN_IF_ERROR(g_.Finish());
  return std::move(g_);
}

Result<uint32_t> Embed(GrammarBuilder& b, const Grammar& g, std::string_view prefix) {
  std::vector<uint32_t> ids(g.rules.size());
  for (size_t r = 0; r < g.rules.size(); ++r) {
    TRELLIS_ASSIGN_OR_RETURN(ids[r], b.RuleId(fmt::format("{}{}", prefix, g.rules[r].name)));
    if (b.Defined(ids[r])) return InvalidArgument(fmt::format("grammar rule '{}{}' is defined twice", prefix, g.rules[r].name));
  }
  std::vector<Element> alt;
  for (size_t r = 0; r < g.rules.size(); ++r) {
    for (uint32_t start : g.rules[r].alts) {
      alt.clear();
      for (uint32_t i = start; g.elements[i].kind != ElementKind::kEnd; ++i) {
        Element e = g.elements[i];
        e.arg = e.kind == ElementKind::kRef ? ids[e.arg] : b.ClassId(g.classes[e.arg]);
        alt.push_back(e);
      }
      TRELLIS_RETURN_IF_ERROR(b.AddAlt(ids[r], alt));
    }
    b.MarkDefined(ids[r]);
  }
  return ids[g.root];
}

bool DecodeUtf8(std::string_view s, std::vector<uint32_t>& out) {
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < kMin[n] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out.push_back(cp);
    i += n;
  }
  return true;
}

Status AppendLiteral(GrammarBuilder& b, std::string_view s, std::vector<Element>& out) {
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(s, cps)) return InvalidArgument("grammar literal is not UTF-8");
  for (uint32_t cp : cps) out.push_back(Element{ElementKind::kClass, b.ClassId(CharClass::Single(cp))});
  return Status::Ok();
}

Status AppendRepetition(GrammarBuilder& b, const std::vector<Element>& x, uint32_t min, int64_t max,
                        std::vector<Element>& out) {
  const GrammarLimits& lim = b.limits();
  if (min > lim.max_repetition || max > static_cast<int64_t>(lim.max_repetition)) {
    return InvalidArgument(fmt::format("grammar repetition count above {}", lim.max_repetition));
  }
  if (max >= 0 && max < min) return InvalidArgument("grammar repetition {m,n} with n < m");
  if (static_cast<uint64_t>(x.size()) * std::max<int64_t>(min, max) > lim.max_elements) {
    return InvalidArgument(fmt::format("grammar has more than {} elements", lim.max_elements));
  }
  // X as one element: the sequence itself when it is a single element, else a rule.
  std::vector<Element> one = x;
  if (x.size() != 1) {
    TRELLIS_ASSIGN_OR_RETURN(uint32_t r, b.NewRule("group"));
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(r, x));
    one = {Element{ElementKind::kRef, r}};
  }
  for (uint32_t i = 0; i < min; ++i) out.insert(out.end(), one.begin(), one.end());
  if (max < 0) {
    if (one[0].kind == ElementKind::kClass) {
      out.push_back(Element{ElementKind::kClassStar, one[0].arg});
      return Status::Ok();
    }
    if (one[0].kind == ElementKind::kClassStar) {
      if (min == 0) out.push_back(one[0]);
      return Status::Ok();
    }
    // star ::= X star | ""
    TRELLIS_ASSIGN_OR_RETURN(uint32_t star, b.NewRule("star"));
    std::vector<Element> alt = one;
    alt.push_back(Element{ElementKind::kRef, star});
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(star, alt));
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(star, {}));
    out.push_back(Element{ElementKind::kRef, star});
    return Status::Ok();
  }
  // Up to max - min more: opt_k ::= X opt_{k-1} | "", nested so that each is optional only
  // after the previous was taken (no ambiguity between which copies were skipped).
  uint32_t tail = 0;
  bool have_tail = false;
  for (int64_t k = 0; k < max - min; ++k) {
    TRELLIS_ASSIGN_OR_RETURN(uint32_t opt, b.NewRule("opt"));
    std::vector<Element> alt = one;
    if (have_tail) alt.push_back(Element{ElementKind::kRef, tail});
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(opt, alt));
    TRELLIS_RETURN_IF_ERROR(b.AddAlt(opt, {}));
    tail = opt;
    have_tail = true;
  }
  if (have_tail) out.push_back(Element{ElementKind::kRef, tail});
  return Status::Ok();
}

// ---- Grammar ----

Status Grammar::Finish() {
  const size_t n = rules.size();
  if (root >= n) return InvalidArgument("grammar has no root rule");
  auto alt_elems = [&](uint32_t start) {
    size_t end = start;
    while (elements[end].kind != ElementKind::kEnd) ++end;
    return std::pair<size_t, size_t>(start, end);
  };

  // Productive: a rule that can complete. Alternatives that cannot (an empty class, a
  // reference to a rule that cannot) are removed, so every stack can reach the end.
  std::vector<bool> productive(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (productive[r]) continue;
      for (uint32_t a : rules[r].alts) {
        auto [b, e] = alt_elems(a);
        bool ok = true;
        for (size_t i = b; i < e && ok; ++i) {
          const Element& el = elements[i];
          if (el.kind == ElementKind::kClass) ok = !classes[el.arg].empty();
          if (el.kind == ElementKind::kRef) ok = productive[el.arg];
        }
        if (ok) {
          productive[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  if (!productive[root]) return InvalidArgument(fmt::format("grammar rule '{}' can never match (unsatisfiable)", rules[root].name));
  for (size_t r = 0; r < n; ++r) {
    auto& alts = rules[r].alts;
    alts.erase(std::remove_if(alts.begin(), alts.end(),
                              [&](uint32_t a) {
                                auto [b, e] = alt_elems(a);
                                for (size_t i = b; i < e; ++i) {
                                  const Element& el = elements[i];
                                  if (el.kind == ElementKind::kClass && classes[el.arg].empty()) return true;
                                  if (el.kind == ElementKind::kRef && !productive[el.arg]) return true;
                                }
                                return false;
                              }),
               alts.end());
  }

  // Nullable: a rule that can match the empty string.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : rules[r].alts) {
        auto [b, e] = alt_elems(a);
        bool ok = true;
        for (size_t i = b; i < e && ok; ++i) {
          const Element& el = elements[i];
          ok = el.kind == ElementKind::kClassStar || (el.kind == ElementKind::kRef && nullable[el.arg]);
        }
        if (ok) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }

  // Left recursion: a cycle in "r can start with s" (through nullable prefixes). The
  // matcher expands references eagerly, so such a rule would never stop expanding.
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (uint32_t a : rules[r].alts) {
      auto [b, e] = alt_elems(a);
      for (size_t i = b; i < e; ++i) {
        const Element& el = elements[i];
        if (el.kind == ElementKind::kClass) break;
        if (el.kind == ElementKind::kRef) {
          left[r].push_back(el.arg);
          if (!nullable[el.arg]) break;
        }
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<uint32_t, size_t>> path{{static_cast<uint32_t>(start), 0}};
    color[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t s = left[r][next++];
      if (color[s] == 1) {
        return InvalidArgument(fmt::format("grammar rule '{}' is left-recursive (through '{}')", rules[s].name, rules[r].name));
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.emplace_back(s, 0);
      }
    }
  }
  InlineLeadingRefs();
  return Status::Ok();
}

void Grammar::InlineLeadingRefs() {
  // An alternative that starts with a reference to a small rule R is replaced by R's
  // alternatives followed by the rest: `s ::= r s | ""` with `r ::= [a-z] | "\\" e`
  // becomes `s ::= [a-z] s | "\\" e s | ""`. The language is the same; what changes is
  // that a character read by r's class now advances a frame of s itself, so a token
  // spanning many repetitions stays inside one frame and its mask is decided there, once
  // per position (token_mask.h), instead of depending on the stack below at every step.
  // Rules all of whose alternatives start with a class, of at most 8 alternatives
  // and 64 elements, are inlined; rounds until nothing changes (a rule whose alternatives
  // now start with classes may be inlined in turn), so a printed grammar parses back to
  // itself. Bounded in rounds and in growth.
  constexpr size_t kMaxAlts = 8, kMaxRuleElements = 64, kMaxGrowth = size_t{1} << 20;
  const size_t n = rules.size();
  const size_t limit = elements.size() + kMaxGrowth;
  for (int round = 0; round < 16; ++round) {
  std::vector<bool> inlinable(n, false);
  for (size_t r = 0; r < n; ++r) {
    if (rules[r].alts.empty() || rules[r].alts.size() > kMaxAlts) continue;
    size_t size = 0;
    bool ok = true;
    for (uint32_t a : rules[r].alts) {
      // Only alternatives that start by reading a character: an empty or nullable start
      // would put the rest of the outer alternative first, to be inlined again.
      if (elements[a].kind != ElementKind::kClass) ok = false;
      for (size_t i = a; elements[i].kind != ElementKind::kEnd; ++i) ++size;
    }
    inlinable[r] = ok && size <= kMaxRuleElements;
  }
  bool any = false;
  for (size_t s = 0; s < n; ++s) {
    std::vector<uint32_t> alts;
    bool changed = false;
    for (uint32_t a : rules[s].alts) {
      const Element first = elements[a];
      if (first.kind != ElementKind::kRef || !inlinable[first.arg] || first.arg == s) {
        alts.push_back(a);
        continue;
      }
      const std::vector<uint32_t> inner = rules[first.arg].alts;  // copy: elements may grow
      size_t rest_len = 0;
      while (elements[a + 1 + rest_len].kind != ElementKind::kEnd) ++rest_len;
      if (elements.size() + inner.size() * (kMaxRuleElements + rest_len + 1) > limit) {
        alts.push_back(a);
        continue;
      }
      for (uint32_t b : inner) {
        alts.push_back(static_cast<uint32_t>(elements.size()));
        for (size_t i = b; elements[i].kind != ElementKind::kEnd; ++i) elements.push_back(elements[i]);
        for (size_t i = 0; i < rest_len; ++i) elements.push_back(elements[a + 1 + i]);
        elements.push_back(Element{ElementKind::kEnd, 0});
      }
      changed = true;
    }
    if (changed) rules[s].alts = std::move(alts);
    any = any || changed;
  }
  if (!any) break;
  }
}

namespace {

void AppendCodePoint(std::string& out, uint32_t cp, bool in_class) {
  if (cp == '"' && !in_class) {
    out += "\\\"";
  } else if (cp == '\\') {
    out += "\\\\";
  } else if (in_class && (cp == ']' || cp == '-' || cp == '^')) {
    out += '\\';
    out += static_cast<char>(cp);
  } else if (cp >= 0x20 && cp < 0x7F) {
    out += static_cast<char>(cp);
  } else if (cp < 0x100) {
    out += fmt::format("\\x{:02X}", cp);
  } else if (cp < 0x10000) {
    out += fmt::format("\\u{:04X}", cp);
  } else {
    out += fmt::format("\\U{:08X}", cp);
  }
}

std::string ClassText(const CharClass& c) {
  if (c.ranges().size() == 1 && c.ranges()[0].first == c.ranges()[0].second) {
    std::string s = "\"";
    AppendCodePoint(s, c.ranges()[0].first, false);
    return s + "\"";
  }
  std::string s = "[";
  for (auto [lo, hi] : c.ranges()) {
    AppendCodePoint(s, lo, true);
    if (hi != lo) {
      s += '-';
      AppendCodePoint(s, hi, true);
    }
  }
  return s + "]";
}

}  // namespace

std::string Grammar::ToGbnf() const {
  std::string out;
  auto emit = [&](const Rule& r) {
    out += r.name;
    out += " ::=";
    for (size_t k = 0; k < r.alts.size(); ++k) {
      if (k) out += " |";
      bool empty = true;
      for (size_t i = r.alts[k]; elements[i].kind != ElementKind::kEnd; ++i) {
        const Element& el = elements[i];
        out += ' ';
        empty = false;
        if (el.kind == ElementKind::kRef) {
          out += rules[el.arg].name;
        } else {
          out += ClassText(classes[el.arg]);
          if (el.kind == ElementKind::kClassStar) out += '*';
        }
      }
      if (empty) out += " \"\"";
    }
    out += '\n';
  };
  // Rules in breadth-first order of first reference from the root, then the unreachable
  // ones by name: an order that depends on the grammar, not on how it was numbered, so a
  // printed grammar prints the same after parsing.
  std::vector<bool> listed(rules.size(), false);
  std::vector<uint32_t> order{root};
  listed[root] = true;
  for (size_t i = 0; i < order.size(); ++i) {
    for (uint32_t a : rules[order[i]].alts) {
      for (size_t e = a; elements[e].kind != ElementKind::kEnd; ++e) {
        if (elements[e].kind == ElementKind::kRef && !listed[elements[e].arg]) {
          listed[elements[e].arg] = true;
          order.push_back(elements[e].arg);
        }
      }
    }
  }
  std::vector<uint32_t> rest;
  for (uint32_t r = 0; r < rules.size(); ++r) {
    if (!listed[r]) rest.push_back(r);
  }
  std::sort(rest.begin(), rest.end(), [&](uint32_t a, uint32_t b) { return rules[a].name < rules[b].name; });
  order.insert(order.end(), rest.begin(), rest.end());
  for (uint32_t r : order) emit(rules[r]);
  return out;
}

uint64_t Grammar::Hash() const {
  const std::string text = ToGbnf();
  return XXH64(text.data(), text.size(), 0);
}

}  // namespace trellis::grammar
