#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/json_schema_numbers.h"
#include "grammar/regex.h"

namespace trellis::grammar {
namespace {

using json = nlohmann::ordered_json;
using namespace schema_numbers;

// Shared rules. Strings keep unescaped runs in one class star so that most tokens inside a
// string are decided by the string's own frame (see token_mask.h).
constexpr const char* kBase = R"GBNF(ws ::= ( " " | "\n" [ \t]{0,20} )?
json-char ::= [^"\\\x00-\x1F] | "\\" json-escape
json-escape ::= ["\\/bfnrt] | "u" [0-9a-fA-F]{4}
json-string ::= "\"" [^"\\\x00-\x1F]* ( "\\" json-escape [^"\\\x00-\x1F]* )* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,19} )
json-number ::= json-int ( "." [0-9]{1,20} )? ( [eE] [-+]? [0-9]{1,3} )?
json-bool ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-bool | json-null
json-object ::= "{" ws ( json-member ( ws "," ws json-member )* ws )? "}"
json-member ::= json-string ws ":" ws json-value
json-array ::= "[" ws ( json-value ( ws "," ws json-value )* ws )? "]"
fmt-2d ::= [0-9] [0-9]
fmt-date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )
fmt-hour ::= [01] [0-9] | "2" [0-3]
fmt-time ::= fmt-hour ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] fmt-hour ":" [0-5] [0-9] )
fmt-uuid ::= [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}
fmt-email ::= [a-zA-Z0-9_.+-]{1,64} "@" [a-zA-Z0-9-]{1,63} ( "." [a-zA-Z0-9-]{1,63} ){1,4}
fmt-octet ::= "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]
fmt-ipv4 ::= fmt-octet "." fmt-octet "." fmt-octet "." fmt-octet
)GBNF";

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                          "$comment", "deprecated",  "readOnly", "writeOnly", "strict",  "$defs",
                                          "definitions"};
  return k;
}

std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::strict); }

bool HasType(const json& v, std::string_view t) {
  if (t == "string") return v.is_string();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    // Any magnitude: 1e108 is an integer, and casting it to int64 would be undefined.
    return std::isfinite(d) && std::trunc(d) == d;
  }
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

// Whether no value can match both schemas, as far as their surface shows: different
// types (integer is a number), disjoint const/enum values, or objects that require a
// common property with disjoint const/enum values (a discriminated union). False when
// unsure. oneOf is honoured only for branches disjoint this way: a grammar for
// alternatives cannot exclude a value that matches two of them.
bool SurelyDisjoint(const json& a, const json& b) {
  if (!a.is_object() || !b.is_object()) return false;
  auto values = [](const json& s) -> std::optional<std::vector<json>> {
    if (s.contains("const")) return std::vector<json>{s["const"]};
    if (s.contains("enum") && s["enum"].is_array()) return std::vector<json>(s["enum"].begin(), s["enum"].end());
    return std::nullopt;
  };
  auto types = [](const json& s) -> std::optional<std::vector<std::string>> {
    if (!s.contains("type")) return std::nullopt;
    std::vector<std::string> t;
    if (s["type"].is_string()) t.push_back(s["type"]);
    if (s["type"].is_array()) {
      for (const json& e : s["type"]) {
        if (e.is_string()) t.push_back(e);
      }
    }
    return t;
  };
  auto overlap = [](const std::string& x, const std::string& y) {
    return x == y || (x == "integer" && y == "number") || (x == "number" && y == "integer");
  };
  const auto va = values(a), vb = values(b);
  const auto ta = types(a), tb = types(b);
  if (va && vb) {
    for (const json& x : *va) {
      for (const json& y : *vb) {
        if (x == y) return false;
      }
    }
    return true;
  }
  if (va && tb) return std::none_of(va->begin(), va->end(), [&](const json& v) {
    return std::any_of(tb->begin(), tb->end(), [&](const std::string& t) { return HasType(v, t); });
  });
  if (vb && ta) return SurelyDisjoint(b, a);
  if (ta && tb) {
    bool any = false;
    for (const std::string& x : *ta) {
      for (const std::string& y : *tb) any = any || overlap(x, y);
    }
    if (!any) return true;
    // Both objects: a discriminator property required by both, with disjoint values.
    if (*ta == std::vector<std::string>{"object"} && *tb == std::vector<std::string>{"object"} && a.contains("required") &&
        b.contains("required") && a.contains("properties") && b.contains("properties") && a["required"].is_array() &&
        b["required"].is_array()) {
      for (const json& p : a["required"]) {
        if (!p.is_string() || std::find(b["required"].begin(), b["required"].end(), p) == b["required"].end()) continue;
        const std::string name = p;
        if (a["properties"].contains(name) && b["properties"].contains(name) && values(a["properties"][name]) &&
            values(b["properties"][name]) && SurelyDisjoint(a["properties"][name], b["properties"][name])) {
          return true;
        }
      }
    }
  }
  return false;
}

class Converter {
 public:
  Converter(const json& root, const GrammarLimits& limits) : root_(root), limits_(limits) {}

  Result<std::string> Run() {
    TRELLIS_ASSIGN_OR_RETURN(std::string e, Visit(root_, "", 0));
    std::string out = "root ::= " + e + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    out += kBase;
    if (out.size() > limits_.max_source_bytes) {
      return InvalidArgument(fmt::format("JSON schema is too large: its grammar is above {} bytes", limits_.max_source_bytes));
    }
    return out;
  }

 private:
  std::string Rule(std::string_view hint, std::string body) {
    std::string name = fmt::format("s{}-{}", rules_.size(), hint);
    rules_.emplace_back(name, std::move(body));
    return name;
  }

  Status Refuse(const std::string& path, std::string_view key) const {
    return Unsupported(fmt::format("JSON Schema keyword '{}' at '{}' is not supported", key, path.empty() ? "/" : path));
  }

  Result<std::string> Visit(const json& s, const std::string& path, int depth) {
    if (depth > limits_.max_nesting) {
      return InvalidArgument(fmt::format("JSON schema nested deeper than {} at '{}'", limits_.max_nesting, path));
    }
    if (++visits_ > limits_.max_rules) return InvalidArgument(fmt::format("JSON schema has more than {} subschemas", limits_.max_rules));
    const std::string where = path.empty() ? "/" : path;
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("json-value");
      return InvalidArgument(fmt::format("JSON schema at '{}' is false: no value is valid", where));
    }
    if (!s.is_object()) return InvalidArgument(fmt::format("JSON schema at '{}' must be an object or a boolean", where));

    static const std::set<std::string> kHandled = {
        "type",     "enum",     "const",       "properties", "required", "additionalProperties", "items",
        "prefixItems", "minItems", "maxItems", "minLength",  "maxLength", "format",  "pattern", "anyOf", "oneOf", "allOf", "$ref", "additionalItems",
        "minimum",  "maximum",  "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
    std::vector<std::string> constraining;
    for (const auto& [k, v] : s.items()) {
      if (Annotations().count(k)) continue;
      if (k == "uniqueItems" && v == false) continue;
      if (!kHandled.count(k)) return Refuse(path + "/" + k, k);
      constraining.push_back(k);
    }
    auto only = [&](std::initializer_list<const char*> allowed) -> Status {
      for (const std::string& k : constraining) {
        if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; })) {
          return Unsupported(fmt::format("JSON Schema keyword '{}' beside '{}' at '{}' is not supported", k,
                                         *allowed.begin(), where));
        }
      }
      return Status::Ok();
    };

    if (s.contains("$ref")) {
      TRELLIS_RETURN_IF_ERROR(only({"$ref"}));
      return Ref(s["$ref"], path, depth);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& alts = s[key];
      if (!alts.is_array() || alts.empty()) return InvalidArgument(fmt::format("'{}' at '{}' must be a non-empty array", key, where));
      // Keywords beside the alternatives hold for each: {base, anyOf: [a, b]} is
      // anyOf: [base + a, base + b], when no keyword appears in both.
      json base = json::object();
      for (const std::string& k : constraining) {
        if (k != key) base[k] = s[k];
      }
      std::vector<json> branches;  // base merged in; false branches left out
      for (size_t i = 0; i < alts.size(); ++i) {
        if (alts[i].is_boolean() && !alts[i].get<bool>()) continue;  // a branch nothing matches
        json branch = alts[i].is_boolean() ? json::object() : alts[i];
        if (!branch.is_object()) return InvalidArgument(fmt::format("'{}/{}' at '{}' must be a schema", key, i, where));
        for (const auto& [k, v] : base.items()) {
          if (branch.contains(k)) {
            return Unsupported(fmt::format("JSON Schema keyword '{}' both beside and inside '{}' at '{}' is not supported", k, key, where));
          }
          branch[k] = v;
        }
        branches.push_back(std::move(branch));
      }
      if (std::string_view(key) == "oneOf") {
        for (size_t i = 0; i < branches.size(); ++i) {
          for (size_t j = i + 1; j < branches.size(); ++j) {
            if (!SurelyDisjoint(branches[i], branches[j])) {
              return Unsupported(fmt::format("'oneOf' at '{}': two branches may both match a value, which a grammar "
                                             "cannot exclude (use anyOf, or give the branches different types or const "
                                             "discriminators)", where));
            }
          }
        }
      }
      std::string body;
      for (size_t i = 0; i < branches.size(); ++i) {
        TRELLIS_ASSIGN_OR_RETURN(std::string e, Visit(branches[i], fmt::format("{}/{}/{}", path, key, i), depth + 1));
        body += (body.empty() ? "" : " | ") + e;
      }
      if (body.empty()) return InvalidArgument(fmt::format("every branch of '{}' at '{}' is false: no value is valid", key, where));
      return Rule("alt", body);
    }
    if (s.contains("allOf")) {
      // allOf of schemas that constrain different keywords is the one schema holding all
      // their keywords; shared keywords would need an intersection, which is refused.
      const json& all = s["allOf"];
      if (!all.is_array() || all.empty()) return InvalidArgument(fmt::format("'allOf' at '{}' must be a non-empty array", where));
      json merged = json::object();
      for (const std::string& k : constraining) {
        if (k != "allOf") merged[k] = s[k];
      }
      for (size_t i = 0; i < all.size(); ++i) {
        if (all[i].is_boolean()) {
          if (!all[i].get<bool>()) return InvalidArgument(fmt::format("'allOf/{}' at '{}' is false: no value is valid", i, where));
          continue;
        }
        if (!all[i].is_object()) return InvalidArgument(fmt::format("'allOf/{}' at '{}' must be a schema", i, where));
        for (const auto& [k, v] : all[i].items()) {
          if (Annotations().count(k)) continue;
          if (merged.contains(k)) {
            return Unsupported(fmt::format("JSON Schema keyword '{}' in more than one part of 'allOf' at '{}' is not supported", k, where));
          }
          merged[k] = v;
        }
      }
      return Visit(merged, path + "/allOf", depth + 1);
    }

    // The types the value may have.
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& e : t) {
          if (!e.is_string()) return InvalidArgument(fmt::format("'type' at '{}' must be a string or an array of strings", where));
          types.push_back(e.get<std::string>());
        }
      } else {
        return InvalidArgument(fmt::format("'type' at '{}' must be a string or an array of strings", where));
      }
      for (const std::string& t2 : types) {
        static const std::set<std::string> kTypes = {"string", "number", "integer", "boolean", "null", "object", "array"};
        if (!kTypes.count(t2)) return InvalidArgument(fmt::format("unknown type '{}' at '{}'", t2, where));
      }
    }

    if (s.contains("const") || s.contains("enum")) {
      std::vector<json> values;
      if (s.contains("const")) {
        values.push_back(s["const"]);
      } else {
        const json& e = s["enum"];
        if (!e.is_array() || e.empty()) return InvalidArgument(fmt::format("'enum' at '{}' must be a non-empty array", where));
        values.assign(e.begin(), e.end());
      }
      for (const std::string& k : constraining) {
        if (k != "const" && k != "enum" && k != "type") {
          return Unsupported(fmt::format("JSON Schema keyword '{}' beside 'enum'/'const' at '{}' is not supported", k, where));
        }
      }
      std::string body;
      for (const json& v : values) {
        if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return HasType(v, t); })) continue;
        if (!body.empty()) body += " | ";
        body += Literal(Dump(v));
      }
      if (body.empty()) return InvalidArgument(fmt::format("no value of 'enum'/'const' at '{}' has the schema's type", where));
      return Rule("enum", body);
    }

    if (types.empty()) {
      // Infer from the keywords present; none: any value.
      auto any_of = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
      };
      if (any_of({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (any_of({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) types.push_back("array");
      if (any_of({"minLength", "maxLength", "format", "pattern"})) types.push_back("string");
      if (any_of({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) types.push_back("number");
      if (types.empty()) return std::string("json-value");
    }
    std::string body;
    for (const std::string& t : types) {
      std::string e;
      if (t == "object") {
        TRELLIS_ASSIGN_OR_RETURN(e, Object(s, path, depth));
      } else if (t == "array") {
        TRELLIS_ASSIGN_OR_RETURN(e, Array(s, path, depth));
      } else if (t == "string") {
        TRELLIS_ASSIGN_OR_RETURN(e, String(s, path));
      } else if (t == "integer" || t == "number") {
        TRELLIS_ASSIGN_OR_RETURN(e, Numeric(s, path, t == "integer"));
      } else if (t == "boolean") {
        e = "json-bool";
      } else {
        e = "json-null";
      }
      body += (body.empty() ? "" : " | ") + e;
    }
    return types.size() == 1 ? body : Rule("types", body);
  }

  Result<std::string> Ref(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return InvalidArgument(fmt::format("'$ref' at '{}' must be a string", path));
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    if (r.empty() || r[0] != '#' || (r.size() > 1 && r[1] != '/')) {
      return Unsupported(fmt::format("'$ref' '{}' at '{}': only references inside the schema ('#', '#/...') are supported", r, path));
    }
    // A JSON Pointer into the schema (~1 is '/', ~0 is '~').
    const json* target = &root_;
    for (size_t i = 2; i <= r.size() && r.size() > 1;) {
      size_t end = r.find('/', i);
      if (end == std::string::npos) end = r.size();
      std::string token;
      for (size_t k = i; k < end; ++k) {
        if (r[k] == '~' && k + 1 < end && (r[k + 1] == '0' || r[k + 1] == '1')) {
          token += r[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          token += r[k];
        }
      }
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 token.size() < 10 && std::stoul(token) < target->size()) {
        target = &(*target)[std::stoul(token)];
      } else {
        return InvalidArgument(fmt::format("'$ref' '{}' at '{}' names no definition", r, path));
      }
      i = end + 1;
    }
    // Named before it is visited, so a recursive schema refers to itself.
    const std::string name = fmt::format("ref{}", refs_.size());
    refs_[r] = name;
    const size_t slot = rules_.size();
    rules_.emplace_back(name, "");
    TRELLIS_ASSIGN_OR_RETURN(std::string body, Visit(*target, r.substr(1), depth + 1));
    rules_[slot].second = body;
    return name;
  }

  // Numbers within minimum / maximum / exclusiveMinimum / exclusiveMaximum (draft 6+
  // numbers, or draft 4's booleans beside minimum / maximum), written without an exponent:
  // a sign, the integer digits (at most 20, no leading zeros), and for "number" a fraction
  // (at most 20 digits). Every such text within the bounds is in the language.
  Result<std::string> Numeric(const json& s, const std::string& path, bool integer) {
    if (s.contains("multipleOf")) return MultipleOf(s, path, integer);
    std::optional<Decimal> lo, hi;
    bool lo_strict = false, hi_strict = false;
    auto read = [&](const char* key) -> Result<std::optional<Decimal>> {
      if (!s.contains(key) || s[key].is_boolean()) return std::optional<Decimal>();
      if (!s[key].is_number()) return InvalidArgument(fmt::format("'{}' at '{}' must be a number", key, path));
      auto d = ToDecimal(s[key]);
      if (!d) return Unsupported(fmt::format("'{}' {} at '{}' has more than 40 digits", key, Dump(s[key]), path));
      return d;
    };
    // The tighter of an inclusive and an exclusive bound; `sign` 1 for lower bounds.
    auto bound = [&](const char* inclusive, const char* exclusive, int sign, std::optional<Decimal>& out,
                     bool& strict) -> Status {
      TRELLIS_ASSIGN_OR_RETURN(std::optional<Decimal> in, read(inclusive));
      TRELLIS_ASSIGN_OR_RETURN(std::optional<Decimal> ex, read(exclusive));
      if (s.contains(exclusive) && s[exclusive].is_boolean()) {  // draft 4
        if (!in) return InvalidArgument(fmt::format("boolean '{}' at '{}' needs '{}'", exclusive, path, inclusive));
        strict = s[exclusive].get<bool>();
      }
      out = in;
      if (ex && (!out || Compare(*ex, *out) * sign >= 0)) {
        out = ex;
        strict = true;
      }
      return Status::Ok();
    };
    TRELLIS_RETURN_IF_ERROR(bound("minimum", "exclusiveMinimum", 1, lo, lo_strict));
    TRELLIS_RETURN_IF_ERROR(bound("maximum", "exclusiveMaximum", -1, hi, hi_strict));
    if (!lo && !hi) return std::string(integer ? "json-int" : "json-number");
    if (lo && hi && (Compare(*lo, *hi) > 0 || (Compare(*lo, *hi) == 0 && (lo_strict || hi_strict)))) {
      return InvalidArgument(fmt::format("the bounds at '{}' leave no number", path));
    }
    // Past the grammar's 20 integer digits a bound holds for every number it writes.
    if (lo && lo->neg && lo->i.size() > kIntDigits) lo.reset();
    if (hi && !hi->neg && hi->i.size() > kIntDigits) hi.reset();
    // The non-negative part [max(lo, 0), hi] and the negative one, as magnitudes.
    std::vector<std::string> alts;
    if (!hi || !hi->neg) {
      std::optional<Decimal> mlo = lo && !lo->neg ? lo : std::nullopt;
      if (auto m = Magnitude(mlo, lo_strict && mlo, hi, hi_strict, integer)) alts.push_back(*m);
    }
    if (!lo || lo->neg) {
      // -m with m in [|hi|, |lo|] when hi <= 0, else m in [0, |lo|] (-0 is 0).
      std::optional<Decimal> mlo, mhi;
      bool mlo_strict = false;
      const bool hi_nonpositive = hi && (hi->neg || (hi->i == "0" && hi->f.empty()));
      if (hi_nonpositive) {
        mlo = hi;
        mlo->neg = false;
        mlo_strict = hi_strict;
      }
      if (lo) {
        mhi = lo;
        mhi->neg = false;
      }
      if (auto m = Magnitude(mlo, mlo_strict, mhi, lo_strict && lo.has_value(), integer)) alts.push_back("\"-\" " + *m);
    }
    if (alts.empty()) return InvalidArgument(fmt::format("the bounds at '{}' leave no number the grammar can write", path));
    std::string body;
    for (const std::string& e : alts) body += (body.empty() ? "" : " | ") + e;
    return Rule(integer ? "int-range" : "number-range", body);
  }

  static constexpr uint64_t kMaxMultipleStates = 2048;

  // Multiples of k = p / 10^q (multipleOf), written without an exponent: a number x is one
  // when x * 10^q is an integer multiple of p. An automaton reads the digits (integer
  // part, then up to q fraction digits, then only zeros) keeping the remainder mod p of
  // the integer they spell; a state is (remainder, fraction digits read). Bounds beside
  // it are refused, except minimum 0 (no minus sign), the common "a price" schema.
  Result<std::string> MultipleOf(const json& s, const std::string& path, bool integer) {
    const json& k = s["multipleOf"];
    if (!k.is_number() || !(k.get<double>() > 0)) {
      return InvalidArgument(fmt::format("'multipleOf' at '{}' must be a number above 0", path));
    }
    bool nonnegative = false;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      if (std::string(key) == "minimum" && s[key].is_number() && s[key].get<double>() == 0) {
        nonnegative = true;
        continue;
      }
      return Unsupported(fmt::format("'multipleOf' together with '{}' at '{}' is not supported (only minimum 0 is)", key, path));
    }
    const auto d = ToDecimal(k);
    if (!d) return Unsupported(fmt::format("'multipleOf' {} at '{}' has more than 40 digits", Dump(k), path));
    std::string digits = d->i + d->f;
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
    const size_t q = d->f.size();
    if (digits.size() > 9 || (std::stoull(digits) * (q + 2) > kMaxMultipleStates)) {
      return Unsupported(fmt::format("'multipleOf' {} at '{}' needs a grammar of more than {} states", Dump(k), path,
                                     kMaxMultipleStates));
    }
    const uint64_t p = std::stoull(digits);
    // pow10[j] = 10^j mod p; a remainder r after the integer part and j fraction digits is
    // a multiple when r * 10^(q - j) = 0 (mod p): the digits not written are zeros.
    std::vector<uint64_t> pow10(q + 1, 1 % p);
    for (size_t j = 1; j <= q; ++j) pow10[j] = pow10[j - 1] * 10 % p;
    const std::string base = fmt::format("s{}-mul", rules_.size());
    auto name = [&](const char* kind, uint64_t r, size_t j) { return fmt::format("{}-{}{}-{}", base, kind, r, j); };
    // live[j][r]: from F(r, j) a multiple can still be finished (j = 1..q; F(r, q) only
    // with r = 0, then zeros). Transitions go to live states only.
    std::vector<std::vector<bool>> live(q + 1, std::vector<bool>(p, false));
    for (size_t j = q; j >= 1; --j) {
      for (uint64_t r = 0; r < p; ++r) {
        bool l = r * pow10[q - j] % p == 0;
        for (int dgt = 0; dgt <= 9 && !l && j < q; ++dgt) l = live[j + 1][(r * 10 + static_cast<uint64_t>(dgt)) % p];
        live[j][r] = l;
      }
    }
    // The digits in [from, 9] that lead from remainder r to each next state, as classes
    // ("" when none leads anywhere live).
    auto steps = [&](uint64_t r, int from, size_t next_j, const char* kind) {
      std::map<uint64_t, std::string> by_target;
      for (int dgt = from; dgt <= 9; ++dgt) {
        const uint64_t t = (r * 10 + static_cast<uint64_t>(dgt)) % p;
        if (next_j == 0 || live[next_j][t]) by_target[t] += static_cast<char>('0' + dgt);
      }
      std::string body;
      for (const auto& [t, ds] : by_target) body += (body.empty() ? "" : " | ") + ("[" + ds + "] " + name(kind, t, next_j));
      return body;
    };
    // The end of an integer part of remainder r: nothing more, or a fraction.
    auto int_end = [&](uint64_t r) {
      std::string end;
      if (r * pow10[q] % p == 0) end = "\"\"";
      if (!integer) {
        std::string frac;
        if (q == 0) {
          if (r == 0) frac = "\".\" \"0\"+";
        } else if (std::string f = steps(r, 0, 1, "f"); !f.empty()) {
          frac = "\".\" ( " + f + " )";
        }
        if (!frac.empty()) end += (end.empty() ? "" : " | ") + frac;
      }
      return end;
    };
    // I(r): the integer part's digits so far spell remainder r (every I state is live: 0
    // can always be reached by more digits). F(r, j): "." and j fraction digits read.
    const std::string zeros = Rule("mul-zeros", "\"0\"*");
    for (uint64_t r = 0; r < p; ++r) {
      std::string body = steps(r, 0, 0, "i");
      if (std::string e = int_end(r); !e.empty()) body += " | " + e;
      rules_.emplace_back(name("i", r, 0), body);
      for (size_t j = 1; j <= q && !integer; ++j) {
        if (!live[j][r]) continue;
        std::string fb;
        if (j < q) fb = steps(r, 0, j + 1, "f");
        if (r * pow10[q - j] % p == 0) fb += (fb.empty() ? "" : " | ") + (j == q ? zeros : std::string("\"\""));
        rules_.emplace_back(name("f", r, j), fb);
      }
    }
    // "0" (no leading zeros), then the end of an integer part of remainder 0; or a first
    // digit 1-9 and more.
    const std::string magnitude = "\"0\" ( " + int_end(0) + " ) | " + steps(0, 1, 0, "i");
    return Rule("multiple", nonnegative ? "( " + magnitude + " )" : "\"-\"? ( " + magnitude + " )");
  }

  Result<std::string> String(const json& s, const std::string& path) {
    if (s.contains("pattern")) {
      // The string's decoded value matches the pattern somewhere (JSON Schema's search
      // semantics); the grammar writes each character as JSON needs it.
      if (s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
        return Unsupported(fmt::format("'pattern' with 'format', 'minLength' or 'maxLength' at '{}' is not supported", path));
      }
      const json& p = s["pattern"];
      if (!p.is_string()) return InvalidArgument(fmt::format("'pattern' at '{}' must be a string", path));
      RegexOptions o;
      o.json_string = o.search = true;
      o.any_char = "json-char";
      auto e = RegexToGbnf(p.get_ref<const std::string&>(), o, limits_);
      if (!e.ok()) return Unsupported(fmt::format("'pattern' at '{}': {}", path, e.status().message()));
      return Rule("pattern", "\"\\\"\" " + *e + " \"\\\"\"");
    }
    if (s.contains("format")) {
      if (s.contains("minLength") || s.contains("maxLength")) {
        return Unsupported(fmt::format("'format' with 'minLength'/'maxLength' at '{}' is not supported", path));
      }
      const json& f = s["format"];
      static const std::map<std::string, std::string> kFormats = {
          {"date", "fmt-date"},   {"time", "fmt-time"},   {"date-time", "fmt-date \"T\" fmt-time"},
          {"uuid", "fmt-uuid"},   {"email", "fmt-email"}, {"ipv4", "fmt-ipv4"}};
      if (!f.is_string() || !kFormats.count(f.get<std::string>())) {
        return Unsupported(fmt::format("'format' {} at '{}' is not supported (date, time, date-time, uuid, email, ipv4 are)",
                                       Dump(f), path));
      }
      return Rule("format", "\"\\\"\" " + kFormats.at(f.get<std::string>()) + " \"\\\"\"");
    }
    if (!s.contains("minLength") && !s.contains("maxLength")) return std::string("json-string");
    TRELLIS_ASSIGN_OR_RETURN(uint64_t min, Count(s, "minLength", 0, path));
    TRELLIS_ASSIGN_OR_RETURN(uint64_t max, Count(s, "maxLength", UINT64_MAX, path));
    if (max < min) return InvalidArgument(fmt::format("maxLength below minLength at '{}'", path));
    return Rule("string", "\"\\\"\" json-char" + Bounds(min, max) + " \"\\\"\"");
  }

  Result<uint64_t> Count(const json& s, const char* key, uint64_t def, const std::string& path) {
    if (!s.contains(key)) return def;
    const json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && HasType(v, "integer"))) {
      return InvalidArgument(fmt::format("'{}' at '{}' must be a non-negative integer", key, path));
    }
    const double d = v.get<double>();
    if (d < 0) return InvalidArgument(fmt::format("'{}' at '{}' must be a non-negative integer", key, path));
    if (d > limits_.max_repetition) {
      return Unsupported(fmt::format("'{}' {} at '{}' is above the supported {}", key, Dump(v), path, limits_.max_repetition));
    }
    return static_cast<uint64_t>(d);
  }

  static std::string Bounds(uint64_t min, uint64_t max) {
    if (max == UINT64_MAX) return min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
    return fmt::format("{{{},{}}}", min, max);
  }

  Result<std::string> Object(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, const json*>> props;
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) return InvalidArgument(fmt::format("'properties' at '{}' must be an object", path));
      for (const auto& [k, v] : p.items()) props.emplace_back(k, &v);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array()) return InvalidArgument(fmt::format("'required' at '{}' must be an array of names", path));
      for (const json& n : r) {
        if (!n.is_string()) return InvalidArgument(fmt::format("'required' at '{}' must be an array of names", path));
        required.insert(n.get<std::string>());
      }
    }
    static const json kTrue = true;
    for (const std::string& n : required) {
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == n; })) props.emplace_back(n, &kTrue);
    }
    // Additional properties: their value's grammar, or empty when there may be none.
    std::string extra_value;
    const json additional = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    if (!(additional.is_boolean() && !additional.get<bool>())) {
      TRELLIS_ASSIGN_OR_RETURN(extra_value, Visit(additional, path + "/additionalProperties", depth + 1));
    }
    // A property whose schema is false may not appear (nor be written as an extra key).
    std::vector<std::string> names;
    for (const auto& p : props) names.push_back(p.first);
    for (auto it = props.begin(); it != props.end();) {
      if (!(it->second->is_boolean() && !it->second->get<bool>())) {
        ++it;
        continue;
      }
      if (required.count(it->first)) {
        return InvalidArgument(fmt::format("required property '{}' at '{}' has the schema false: no value is valid", it->first, path));
      }
      it = props.erase(it);
    }
    std::vector<std::string> kv;
    for (const auto& [name, schema] : props) {
      TRELLIS_ASSIGN_OR_RETURN(std::string v, Visit(*schema, path + "/properties/" + name, depth + 1));
      kv.push_back(Rule("kv", Literal(Dump(json(name))) + " ws \":\" ws " + v));
    }
    std::string extra_kv;
    if (!extra_value.empty()) {
      TRELLIS_ASSIGN_OR_RETURN(std::string key, OtherKey(names));
      extra_kv = Rule("extra", key + " ws \":\" ws " + extra_value);
    }
    // after[i]: the rest once something was written, from property i on; first[i]: the
    // same when nothing was written yet. Required ones must come, optional ones may.
    const size_t n = props.size();
    std::vector<std::string> after(n + 1), first(n + 1);
    after[n] = Rule("after", extra_kv.empty() ? "\"\"" : "( ws \",\" ws " + extra_kv + " )*");
    first[n] = Rule("first", extra_kv.empty() ? "\"\"" : "( " + extra_kv + " " + after[n] + " )?");
    for (size_t i = n; i-- > 0;) {
      const bool req = required.count(props[i].first) > 0;
      after[i] = Rule("after", req ? "ws \",\" ws " + kv[i] + " " + after[i + 1]
                                   : "( ws \",\" ws " + kv[i] + " )? " + after[i + 1]);
      first[i] = Rule("first", req ? kv[i] + " " + after[i + 1] : kv[i] + " " + after[i + 1] + " | " + first[i + 1]);
    }
    return Rule("object", "\"{\" ws " + first[0] + " ws \"}\"");
  }

  // A JSON string key that is none of `names`: a trie over the names' characters, with
  // any other character leading to a free tail. Keys written this way use no escapes (so
  // no escaped spelling of a declared name can slip through).
  Result<std::string> OtherKey(const std::vector<std::string>& names) {
    if (names.empty()) return std::string("json-string");
    struct Node {
      std::map<std::string, size_t> next;  // one UTF-8 character -> child
      bool end = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t at = 0;
      for (size_t i = 0; i < name.size();) {
        const auto c = static_cast<unsigned char>(name[i]);
        const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        const std::string ch = name.substr(i, len);
        i += len;
        auto it = trie[at].next.find(ch);
        if (it == trie[at].next.end()) {
          trie.emplace_back();
          it = trie[at].next.emplace(ch, trie.size() - 1).first;
        }
        at = it->second;
      }
      trie[at].end = true;
    }
    const std::string tail = "[^\"\\\\\\x00-\\x1F]* \"\\\"\"";
    std::vector<std::string> node_rule(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) node_rule[i] = fmt::format("key{}-{}", key_tries_, i);
    ++key_tries_;
    for (size_t i = 0; i < trie.size(); ++i) {
      std::string body, excluded;
      for (const auto& [ch, child] : trie[i].next) {
        // Names with quotes, backslashes or control characters cannot be spelled by an
        // extra key (which uses no escapes), so they need no exclusion.
        if (ch == "\"" || ch == "\\" || static_cast<unsigned char>(ch[0]) < 0x20) continue;
        body += (body.empty() ? "" : " | ") + Literal(ch) + " " + node_rule[child];
        excluded += ch == "]" || ch == "^" || ch == "-" ? "\\" + ch : ch;
      }
      body += (body.empty() ? "" : " | ") + std::string("[^\"\\\\\\x00-\\x1F") + excluded + "] " + tail;
      if (!trie[i].end) body += " | \"\\\"\"";
      rules_.emplace_back(node_rule[i], body);
    }
    return Rule("key", "\"\\\"\" " + node_rule[0]);
  }

  Result<std::string> Array(const json& s, const std::string& path, int depth) {
    std::vector<std::string> prefix;
    uint64_t tuple_max = UINT64_MAX;  // a false item at i: at most i items
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) return InvalidArgument(fmt::format("'prefixItems' at '{}' must be an array", path));
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].is_boolean() && !p[i].get<bool>()) {
          tuple_max = i;
          break;
        }
        TRELLIS_ASSIGN_OR_RETURN(std::string e, Visit(p[i], fmt::format("{}/prefixItems/{}", path, i), depth + 1));
        prefix.push_back(e);
      }
    }
    // Before draft 2020-12 a tuple was `items: [...]` with `additionalItems` for the rest.
    const bool tuple = s.contains("items") && s["items"].is_array();
    if (tuple && s.contains("prefixItems")) return Refuse(path + "/items", "items (as an array, beside prefixItems)");
    if (!tuple && s.contains("additionalItems")) return Refuse(path + "/additionalItems", "additionalItems (without items as an array)");
    if (tuple) {
      const json& p = s["items"];
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].is_boolean() && !p[i].get<bool>()) {
          tuple_max = i;
          break;
        }
        TRELLIS_ASSIGN_OR_RETURN(std::string e, Visit(p[i], fmt::format("{}/items/{}", path, i), depth + 1));
        prefix.push_back(e);
      }
    }
    const char* rest_key = tuple ? "additionalItems" : "items";
    std::string item;  // empty: no items past the prefix
    if (s.contains(rest_key)) {
      const json& it = s[rest_key];
      if (it.is_array()) return InvalidArgument(fmt::format("'{}' at '{}' must be a schema", rest_key, path));
      if (!(it.is_boolean() && !it.get<bool>())) {
        TRELLIS_ASSIGN_OR_RETURN(item, Visit(it, path + "/" + rest_key, depth + 1));
      }
    } else {
      item = "json-value";
    }
    TRELLIS_ASSIGN_OR_RETURN(uint64_t min, Count(s, "minItems", 0, path));
    TRELLIS_ASSIGN_OR_RETURN(uint64_t max, Count(s, "maxItems", UINT64_MAX, path));
    if (max < min) return InvalidArgument(fmt::format("maxItems below minItems at '{}'", path));
    if (tuple_max != UINT64_MAX) {
      max = std::min(max, tuple_max);
      item.clear();
      if (max < min) return InvalidArgument(fmt::format("minItems at '{}' asks for more items than the schema allows", path));
    }
    const uint64_t k = prefix.size();
    const std::string close = "ws \"]\"";
    // a[i]: the rest after i items. Past the prefix, `item` repeats within the bounds.
    std::string tail;
    {
      const uint64_t lo = min > k ? min - k : 0;
      const uint64_t hi = max == UINT64_MAX ? UINT64_MAX : (max > k ? max - k : 0);
      if (item.empty() || hi == 0) {
        if (lo > 0) return InvalidArgument(fmt::format("minItems at '{}' asks for more items than the schema allows", path));
        tail = close;
      } else if (k == 0) {
        // No prefix: the first item has no comma before it.
        const std::string more = fmt::format("( ws \",\" ws {} ){}", item, Bounds(lo > 0 ? lo - 1 : 0, hi == UINT64_MAX ? hi : hi - 1));
        tail = lo == 0 ? fmt::format("( {} {} )? {}", item, more, close) : fmt::format("{} {} {}", item, more, close);
      } else {
        tail = fmt::format("( ws \",\" ws {} ){} {}", item, Bounds(lo, hi), close);
      }
    }
    std::string next = Rule("items", tail);
    for (uint64_t i = std::min<uint64_t>(k, max); i-- > 0;) {
      const std::string sep = i == 0 ? "" : "ws \",\" ws ";
      std::string body = sep + prefix[i] + " " + next;
      if (i >= min) body += " | " + close;
      next = Rule("items", body);
    }
    return Rule("array", "\"[\" ws " + next);
  }

  const json& root_;
  GrammarLimits limits_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> refs_;
  size_t visits_ = 0;
  int key_tries_ = 0;
};

}  // namespace

Result<std::string> JsonSchemaToGbnf(std::string_view schema, const GrammarLimits& limits) {
  if (schema.size() > limits.max_source_bytes) {
    return InvalidArgument(fmt::format("JSON schema is {} bytes, above the limit of {}", schema.size(), limits.max_source_bytes));
  }
  // Parsed with a depth bound (the parser itself is iterative; the bound keeps the
  // converter's recursion and the document's destruction shallow).
  bool too_deep = false;
  const int max_depth = limits.max_nesting * 2 + 8;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t, json&) {
    if (depth > max_depth) too_deep = true;
    return !too_deep;
  };
  json root = json::parse(schema.begin(), schema.end(), cb, /*allow_exceptions=*/false);
  if (too_deep) return InvalidArgument(fmt::format("JSON schema nested deeper than {}", max_depth));
  if (root.is_discarded()) return InvalidArgument("JSON schema is not valid JSON");
  return Converter(root, limits).Run();
}

Result<Grammar> CompileJsonSchema(std::string_view schema, const GrammarLimits& limits) {
  TRELLIS_ASSIGN_OR_RETURN(std::string gbnf, JsonSchemaToGbnf(schema, limits));
  GrammarLimits l = limits;
  l.max_source_bytes = std::max<size_t>(l.max_source_bytes, gbnf.size());
  auto g = ParseGbnf(gbnf, l);
  if (!g.ok()) return InvalidArgument("JSON schema: " + g.status().message());
  return g;
}

std::string JsonValueGbnf() { return std::string("root ::= json-value\n") + kBase; }
std::string JsonObjectGbnf() { return std::string("root ::= json-object\n") + kBase; }

}  // namespace trellis::grammar
