#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <exception>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

// Every field of a request is implemented, refused with 400 naming it, or one that changes
// nothing the client receives (AcceptNoEffect); the readers note each field they read, and
// Reader::RefuseUnread refuses the rest, so a field this server does not know is never
// dropped. Fields not implemented are refused unless they hold their no-op value
// (RefuseUnimplementedSampling) or always (RefuseUnsupported). Output constraints
// (response_format, grammar, json_schema, guided_*, ...): ReadConstraint. The lists, by
// kind: docs/server.md, "Every field is implemented, refused, or changes nothing".

namespace trellis::server {
namespace {

using json = nlohmann::json;

// Model output and token pieces may hold partial UTF-8: replace, never throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError Bad(std::string param, std::string message, std::string code = "") {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// Length of the well-formed UTF-8 sequence starting at s[i] (Unicode table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF), or 0 if it is ill-formed.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return b(k) >= lo && b(k) <= hi; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

// `s` cut to kMaxEchoBytes on a UTF-8 boundary, for quoting in an error message.
std::string Clip(std::string_view s) {
  if (s.size() <= kMaxEchoBytes) return std::string(s);
  size_t n = kMaxEchoBytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// A client value in an error message. Never dump() it: a deep value would recurse and a
// large one bloat the message.
std::string Describe(const json& v) {
  switch (v.type()) {
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float:
    case json::value_t::boolean:
    case json::value_t::null: return v.dump();  // bounded: at most ~25 characters
    case json::value_t::string: return "the string '" + Clip(v.get_ref<const std::string&>()) + "'";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return std::string("a ") + v.type_name();
  }
}

// Reads optional fields of one JSON object with type and range checks. The first error
// sticks; later reads are no-ops. null counts as absent (the OpenAI API allows it).
class Reader {
 public:
  explicit Reader(const json& obj) : obj_(obj) {}
  bool ok() const { return !error_.has_value(); }
  ApiError error() const { return *error_; }
  void Fail(std::string param, std::string msg, std::string code = "") {
    if (!error_) error_ = Bad(std::move(param), std::move(msg), std::move(code));
  }
  const json* Get(const char* key) {
    if (error_) return nullptr;
    if (std::find(read_.begin(), read_.end(), key) == read_.end()) read_.emplace_back(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void Bool(const char* key, bool& out) {
    if (const json* v = Get(key)) {
      if (!v->is_boolean()) return Fail(key, std::string("'") + key + "' must be a boolean, got " + Describe(*v));
      out = v->get<bool>();
    }
  }
  void String(const char* key, std::string& out) {
    if (const json* v = Get(key)) {
      if (!v->is_string()) return Fail(key, std::string("'") + key + "' must be a string, got " + Describe(*v));
      out = v->get<std::string>();
    }
  }
  // A float in [lo, hi] (lo excluded if lo_open).
  void Float(const char* key, float& out, double lo, double hi, bool lo_open = false) {
    if (const json* v = Get(key)) {
      if (!v->is_number()) return Fail(key, std::string("'") + key + "' must be a number, got " + Describe(*v));
      const double d = v->get<double>();
      if (!std::isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo)) {
        return Fail(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) +
                             "], got " + Describe(*v));
      }
      // Checked again after the conversion: 1e-50 passes (0, 1] as a double and is 0.0f.
      const float f = static_cast<float>(d);
      if (f > static_cast<float>(hi) || (lo_open ? f <= static_cast<float>(lo) : f < static_cast<float>(lo))) {
        return Fail(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) +
                             "] as a 32-bit float, got " + Describe(*v));
      }
      out = f;
    }
  }
  // An integer in [lo, hi]. Floats (1.0, 1e400 -> refused by the parser, 2^64 -> a float)
  // are not integers: no float is ever converted to an integer type.
  bool Int(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    if (const json* v = Get(key)) {
      if (!v->is_number_integer()) {
        Fail(key, std::string("'") + key + "' must be an integer, got " + Describe(*v));
        return false;
      }
      if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : v->get<int64_t>() > hi) {
        Fail(key, std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + Describe(*v));
        return false;
      }
      const int64_t x = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
      if (x < lo) {
        Fail(key, std::string("'") + key + "' must be at least " + std::to_string(lo) + ", got " + Describe(*v));
        return false;
      }
      out = x;
      return true;
    }
    return false;
  }

  // Every member no reader asked for (and not null) is refused, named: a field this server
  // does not know might change the answer, and an answer that ignored it would look like
  // one that honoured it. (OpenAI refuses unknown fields too.) Call after all reads.
  void RefuseUnread(const std::string& prefix = "") {
    if (error_) return;
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (it->is_null() || std::find(read_.begin(), read_.end(), it.key()) != read_.end()) continue;
      const std::string name = prefix + Clip(it.key());
      return Fail(name, "unknown field '" + name +
                            "': this server does not implement it and refuses it rather than ignore it "
                            "(docs/server.md lists the fields it takes)",
                  "unknown_parameter");
    }
  }

 private:
  static std::string Num(double d) {
    std::string s = std::to_string(d);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& obj_;
  std::vector<std::string> read_;  // keys asked for, present or not
  std::optional<ApiError> error_;
};

// The shape check, then the DOM. Parse errors are reported by position, never with the
// parser's message (it quotes the last token read, which may be megabytes long).
std::optional<ApiError> ParseObject(std::string_view body, const JsonShapeLimits& shape, json& out) {
  if (auto e = CheckJsonShape(body, shape)) return e;
  try {
    out = json::parse(body);
  } catch (const json::parse_error& e) {
    return Bad("", "the request body is not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::out_of_range&) {
    return Bad("", "the request body is not valid JSON (a number is out of range)");
  } catch (const json::exception&) {
    return Bad("", "the request body is not valid JSON");
  }
  if (!out.is_object()) return Bad("", "the request body must be a JSON object");
  return std::nullopt;
}

void ReadModel(Reader& r, const ApiLimits& limits, std::string& model, std::optional<ApiError>& not_found) {
  r.String("model", model);
  if (r.ok() && !model.empty() && model != limits.model_id) {
    ApiError e;
    e.status = 404;
    e.message = "The model '" + Clip(model) + "' does not exist (this server serves '" + limits.model_id + "')";
    e.param = "model";
    e.code = "model_not_found";
    not_found = e;
  }
}

// A text prompt that cannot fit the context whatever it tokenizes to.
ApiError PromptTooLong(const char* param, size_t bytes, const ApiLimits& limits) {
  return Bad(param,
             "the prompt holds " + std::to_string(bytes) + " bytes of text; this model's context of " +
                 std::to_string(limits.n_ctx) + " tokens holds at most " + std::to_string(limits.max_prompt_bytes),
             "context_length_exceeded");
}

// Fields that would change the output and are not implemented: 400 naming them, rather
// than an answer that silently ignores them. See the list at the top of the file.
void RefuseUnsupported(Reader& r, bool chat) {
  // Tools are a chat affair (ReadTools); a raw prompt has no template to offer them in.
  for (const char* key : {"tools", "functions"}) {
    if (const json* t = r.Get(key); !chat && t && !(t->is_array() && t->empty())) {
      r.Fail(key, std::string("'") + key + "' is for chat completions (a raw prompt has no template to offer them in)");
    }
  }
  for (const char* key : {"tool_choice", "function_call"}) {
    if (const json* t = r.Get(key); !chat && t && !(t->is_string() && t->get_ref<const std::string&>() == "none")) {
      r.Fail(key, std::string("'") + key + "' is for chat completions; only \"none\" here");
    }
  }
  if (const json* m = r.Get("modalities"); m && !(m->is_array() && m->size() == 1 && (*m)[0] == "text")) {
    r.Fail("modalities", "only the text modality is supported: 'modalities' may only be [\"text\"]");
  }
  for (const char* key : {"audio", "web_search_options"}) {
    if (r.Get(key)) r.Fail(key, std::string("'") + key + "' is not supported by this server");
  }
}

// logit_bias in OpenAI's form, {"<token id>": bias}, or llama.cpp's, [[id, bias|false]]
// (false bans). Ids below n_vocab, biases in [-100, 100], at most kMaxLogitBias entries,
// and at least one token left unbanned (-100 bans: see SamplerParams::logit_bias).
void ReadLogitBias(Reader& r, const ApiLimits& limits, GenerationParams& g) {
  const json* lb = r.Get("logit_bias");
  if (!lb) return;
  if (!lb->is_object() && !lb->is_array()) {
    return r.Fail("logit_bias", "'logit_bias' must be an object of token id -> bias, got " + Describe(*lb));
  }
  if (lb->size() > kMaxLogitBias) {
    return r.Fail("logit_bias", "'logit_bias' holds at most " + std::to_string(kMaxLogitBias) + " entries, got " +
                                    std::to_string(lb->size()));
  }
  std::map<int32_t, float> bias;
  auto add = [&](const std::string& id_text, int64_t id, const json& v) {
    if (id < 0 || id >= limits.n_vocab) {
      r.Fail("logit_bias", "'logit_bias' token ids must be integers in [0, " + std::to_string(limits.n_vocab) +
                               "), got " + id_text.substr(0, kMaxEchoBytes));
      return false;
    }
    double d = -100.0;  // false: banned (llama.cpp's form)
    if (!(v.is_boolean() && !v.get<bool>())) {
      if (!v.is_number() || !std::isfinite(d = v.get<double>()) || d < -100.0 || d > 100.0) {
        r.Fail("logit_bias", "'logit_bias' biases must be numbers in [-100, 100], got " + Describe(v));
        return false;
      }
    }
    bias[static_cast<int32_t>(id)] = static_cast<float>(d);
    return true;
  };
  if (lb->is_object()) {
    for (const auto& [key, v] : lb->items()) {
      int64_t id = -1;  // decimal digits only: no sign, no spaces, no exponent
      if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) {
        id = std::stoll(key);
      }
      if (!add(key, id, v)) return;
    }
  } else {
    for (const json& e : *lb) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer()) {
        return r.Fail("logit_bias", "'logit_bias' as an array holds [token id, bias or false] pairs, got " + Describe(e));
      }
      const int64_t id = e[0].is_number_unsigned() ? (e[0].get<uint64_t>() > INT32_MAX ? -1 : e[0].get<int64_t>())
                                                   : e[0].get<int64_t>();
      if (!add(e[0].dump(), id, e[1])) return;
    }
  }
  size_t banned = 0;
  for (const auto& [id, b] : bias) banned += b <= -100.0f;
  if (banned >= static_cast<size_t>(limits.n_vocab)) {
    return r.Fail("logit_bias", "'logit_bias' bans every token of the vocabulary");
  }
  g.logit_bias.assign(bias.begin(), bias.end());
}

// ---- constrained output ----

grammar::GrammarLimits ApiGrammarLimits() {
  grammar::GrammarLimits l;
  l.max_source_bytes = kMaxGrammarBytes;
  return l;
}

// A grammar compiled by `compile` from the string field `param` (`what` it must hold, for
// the message): GBNF text or a regular expression, under the same size bound.
template <typename Compile>
Parsed<std::shared_ptr<const grammar::Grammar>> StringGrammar(const std::string& param, const json& v, const char* what,
                                                              Compile compile) {
  if (!v.is_string()) return Bad(param, "'" + param + "' must be " + what + ", got " + Describe(v));
  const std::string& text = v.get_ref<const std::string&>();
  if (text.size() > kMaxGrammarBytes) {
    return Bad(param, "'" + param + "' is " + std::to_string(text.size()) + " bytes, above the limit of " +
                          std::to_string(kMaxGrammarBytes));
  }
  Result<grammar::Grammar> g = compile(text);
  if (!g.ok()) return Bad(param, "'" + param + "': " + g.status().message(), "invalid_grammar");
  return std::shared_ptr<const grammar::Grammar>(std::make_shared<grammar::Grammar>(std::move(*g)));
}

// A grammar from GBNF text; the error names `param`.
Parsed<std::shared_ptr<const grammar::Grammar>> GbnfGrammar(const std::string& param, const json& v) {
  return StringGrammar(param, v, "a string of GBNF",
                       [](const std::string& t) { return grammar::ParseGbnf(t, ApiGrammarLimits()); });
}

// A regular expression the whole answer must match (vLLM's guided_regex, SGLang's regex).
Parsed<std::shared_ptr<const grammar::Grammar>> RegexGrammar(const std::string& param, const json& v) {
  return StringGrammar(param, v, "a string (a regular expression)",
                       [](const std::string& t) { return grammar::CompileRegex(t, ApiGrammarLimits()); });
}

// The source text of member `key` of the JSON object text `obj` (valid JSON: the body
// was parsed), or empty if absent. A key written with escapes is not found (the caller
// then falls back to the parsed value).
std::string_view RawMember(std::string_view obj, std::string_view key) {
  size_t i = 0;
  auto ws = [&] {
    while (i < obj.size() && (obj[i] == ' ' || obj[i] == '\t' || obj[i] == '\n' || obj[i] == '\r')) ++i;
  };
  auto skip_string = [&] {  // at the opening quote; returns the raw content
    const size_t b = ++i;
    while (i < obj.size() && obj[i] != '"') i += obj[i] == '\\' ? 2 : 1;
    return obj.substr(b, std::min(i++, obj.size()) - b);
  };
  auto skip_value = [&] {
    ws();
    const size_t b = i;
    int depth = 0;
    while (i < obj.size()) {
      const char c = obj[i];
      if (c == '"') {
        skip_string();
        if (depth == 0) break;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') {
        if (depth == 0) break;  // the end of the enclosing object
        if (--depth == 0) {
          ++i;
          break;
        }
      }
      if (depth == 0 && c == ',') break;
      ++i;
    }
    size_t e = i;
    while (e > b && (obj[e - 1] == ' ' || obj[e - 1] == '\n' || obj[e - 1] == '\t' || obj[e - 1] == '\r')) --e;
    return obj.substr(b, e - b);
  };
  ws();
  if (i >= obj.size() || obj[i] != '{') return {};
  ++i;
  while (true) {
    ws();
    if (i >= obj.size() || obj[i] != '"') return {};
    const std::string_view k = skip_string();
    ws();
    if (i >= obj.size() || obj[i] != ':') return {};
    ++i;
    const std::string_view v = skip_value();
    if (k == key) return v;
    ws();
    if (i >= obj.size() || obj[i] != ',') return {};
    ++i;
  }
}

// A grammar from a JSON schema (an object or boolean, or JSON text of one); the error names
// `param`. `raw`: the value's source text when known, so the schema keeps the client's key order
// (the parsed value's objects are sorted by key), which is the order the answer writes
// properties in.
Parsed<std::shared_ptr<const grammar::Grammar>> SchemaGrammar(const std::string& param, const json& v,
                                                              std::string_view raw = {}) {
  std::string text;
  if (v.is_string()) {
    text = v.get<std::string>();
  } else if (v.is_object() || v.is_boolean()) {
    text = raw.empty() ? Dump(v) : std::string(raw);
  } else {
    return Bad(param, "'" + param + "' must be a JSON schema (an object), got " + Describe(v));
  }
  if (text.size() > kMaxGrammarBytes) {
    return Bad(param, "'" + param + "' is " + std::to_string(text.size()) + " bytes, above the limit of " +
                          std::to_string(kMaxGrammarBytes));
  }
  auto g = grammar::CompileJsonSchema(text, ApiGrammarLimits());
  if (!g.ok()) {
    return Bad(param, "'" + param + "': " + g.status().message(),
               g.status().code() == StatusCode::kUnsupported ? "unsupported_schema" : "invalid_schema");
  }
  return std::shared_ptr<const grammar::Grammar>(std::make_shared<grammar::Grammar>(std::move(*g)));
}

Parsed<std::shared_ptr<const grammar::Grammar>> FixedGrammar(const std::string& gbnf) {
  auto g = grammar::ParseGbnf(gbnf);
  if (!g.ok()) return Bad("", "internal grammar: " + g.status().message());  // a bug: tested
  return std::shared_ptr<const grammar::Grammar>(std::make_shared<grammar::Grammar>(std::move(*g)));
}

// One of the listed strings, exactly.
Parsed<std::shared_ptr<const grammar::Grammar>> ChoiceGrammar(const std::string& param, const json& v) {
  if (!v.is_array() || v.empty() || v.size() > kMaxChoices) {
    return Bad(param, "'" + param + "' must be an array of 1 to " + std::to_string(kMaxChoices) + " strings");
  }
  std::string gbnf = "root ::=";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty()) {
      return Bad(param, "'" + param + "' must hold non-empty strings, got " + Describe(v[i]));
    }
    gbnf += (i ? " | \"" : " \"");
    for (unsigned char c : v[i].get_ref<const std::string&>()) {
      if (c == '"' || c == '\\') {
        gbnf += '\\';
        gbnf += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7F) {
        static const char* kHex = "0123456789ABCDEF";
        gbnf += "\\x";
        gbnf += kHex[c >> 4];
        gbnf += kHex[c & 15];
      } else {
        gbnf += static_cast<char>(c);
      }
    }
    gbnf += '"';
  }
  if (gbnf.size() > kMaxGrammarBytes) return Bad(param, "'" + param + "' is too large");
  return GbnfGrammar(param, json(gbnf));
}

// Reads every field that constrains the output's form; at most one may be given.
void ReadConstraint(Reader& r, std::string_view body, GenerationParams& g) {
  std::vector<std::pair<std::string, Parsed<std::shared_ptr<const grammar::Grammar>>>> found;
  if (const json* f = r.Get("response_format")) {
    const auto type = f->is_object() ? f->find("type") : f->end();
    if (type == f->end() || !type->is_string()) {
      return r.Fail("response_format", "'response_format' must be an object with a string 'type'");
    }
    if (*type == "json_object") {
      // llama.cpp also takes a schema here.
      auto schema = f->find("schema");
      found.emplace_back("response_format", schema != f->end() && !schema->is_null()
                                                ? SchemaGrammar("response_format.schema", *schema,
                                                                RawMember(RawMember(body, "response_format"), "schema"))
                                                : FixedGrammar(grammar::JsonObjectGbnf()));
    } else if (*type == "json_schema") {
      auto js = f->find("json_schema");
      if (js == f->end() || !js->is_object()) {
        return r.Fail("response_format.json_schema", "'response_format' of type json_schema needs a 'json_schema' object");
      }
      auto schema = js->find("schema");
      found.emplace_back("response_format", schema != js->end() && !schema->is_null()
                                                ? SchemaGrammar("response_format.json_schema.schema", *schema,
                                                                RawMember(RawMember(RawMember(body, "response_format"),
                                                                                    "json_schema"), "schema"))
                                                : FixedGrammar(grammar::JsonObjectGbnf()));
    } else if (*type != "text") {
      return r.Fail("response_format", "'response_format' type must be text, json_object or json_schema, got " + Describe(*type));
    }
  }
  for (const char* key : {"json_schema", "guided_json"}) {
    if (const json* v = r.Get(key)) found.emplace_back(key, SchemaGrammar(key, *v, RawMember(body, key)));
  }
  for (const char* key : {"grammar", "guided_grammar", "ebnf"}) {
    if (const json* v = r.Get(key)) found.emplace_back(key, GbnfGrammar(key, *v));
  }
  if (const json* v = r.Get("guided_choice")) found.emplace_back("guided_choice", ChoiceGrammar("guided_choice", *v));
  for (const char* key : {"guided_regex", "regex"}) {
    if (const json* v = r.Get(key)) found.emplace_back(key, RegexGrammar(key, *v));
  }
  if (const json* so = r.Get("structured_outputs")) {
    if (!so->is_object()) return r.Fail("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [k, v] : so->items()) {
      const std::string param = "structured_outputs." + k;
      if (v.is_null()) continue;
      if (k == "json") {
        found.emplace_back(param, SchemaGrammar(param, v, RawMember(RawMember(body, "structured_outputs"), "json")));
      } else if (k == "grammar") {
        found.emplace_back(param, GbnfGrammar(param, v));
      } else if (k == "choice") {
        found.emplace_back(param, ChoiceGrammar(param, v));
      } else if (k == "json_object") {
        if (v != true) return r.Fail(param, "'" + param + "' may only be true");
        found.emplace_back(param, FixedGrammar(grammar::JsonObjectGbnf()));
      } else if (k == "regex") {
        found.emplace_back(param, RegexGrammar(param, v));
      } else if (k == "disable_any_whitespace" || k == "disable_additional_properties" || k == "whitespace_pattern") {
        if (v != false && !(k == "whitespace_pattern" && v.is_null())) return r.Fail(param, "'" + param + "' is not supported");
      } else if (k != "backend" && k != "disable_fallback") {
        return r.Fail(param, "'" + param + "' is not supported");
      }
    }
  }
  if (const json* v = r.Get("guided_whitespace_pattern")) {
    (void)v;
    return r.Fail("guided_whitespace_pattern", "'guided_whitespace_pattern' is not supported");
  }
  if (found.empty()) return;
  if (found.size() > 1) {
    return r.Fail(found[1].first, "only one output constraint may be given; got '" + found[0].first + "' and '" +
                                      found[1].first + "'");
  }
  auto& [param, parsed] = found[0];
  if (!parsed.ok()) {
    const ApiError& e = parsed.error();
    return r.Fail(e.param.empty() ? param : e.param, e.message, e.code);
  }
  g.grammar = *parsed;
  g.grammar_param = param;
}

// llama.cpp / vLLM / SGLang fields that change the output and are not implemented: refused
// unless they hold their no-op value (what the client gets is then what it asked for).
void RefuseUnimplementedSampling(Reader& r) {
  struct Field {
    const char* key;
    bool (*is_default)(const json&);
  };
  static const Field kFields[] = {
      {"mirostat", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"typical_p", [](const json& v) { return v.is_number() && v.get<double>() >= 1; }},
      {"dynatemp_range", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"xtc_probability", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"dry_multiplier", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"top_n_sigma", [](const json& v) { return v.is_number() && v.get<double>() <= 0; }},
      {"n_probs", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"min_tokens", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"n_keep", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"samplers", [](const json&) { return false; }},
      {"use_beam_search", [](const json& v) { return v == false; }},
      {"length_penalty", [](const json& v) { return v.is_number() && v.get<double>() == 1; }},
      {"stop_token_ids", [](const json& v) { return v.is_array() && v.empty(); }},
      {"bad_words", [](const json& v) { return v.is_array() && v.empty(); }},
      {"allowed_token_ids", [](const json& v) { return v.is_array() && v.empty(); }},
      {"include_stop_str_in_output", [](const json& v) { return v == false; }},
      {"skip_special_tokens", [](const json& v) { return v == true; }},
      {"spaces_between_special_tokens", [](const json& v) { return v == true; }},
      {"prompt_logprobs", [](const json&) { return false; }},
      {"chat_template", [](const json&) { return false; }},
      {"add_generation_prompt", [](const json& v) { return v == true; }},
      {"continue_final_message", [](const json& v) { return v == false; }},
      {"documents", [](const json& v) { return v.is_array() && v.empty(); }},
      {"truncate_prompt_tokens", [](const json&) { return false; }},
      {"logits_processors", [](const json&) { return false; }},
      // llama-server's own client fields: a lazy grammar's triggers (this server builds
      // its own from the tools), tokens kept whole, extra output, per-request adapters.
      {"grammar_lazy", [](const json& v) { return v == false; }},
      {"grammar_triggers", [](const json& v) { return v.is_array() && v.empty(); }},
      {"preserved_tokens", [](const json& v) { return v.is_array() && v.empty(); }},
      {"n_indent", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"t_max_predict_ms", [](const json& v) { return v.is_number() && v.get<double>() <= 0; }},
      {"min_keep", [](const json& v) { return v.is_number() && v.get<double>() == 0; }},
      {"lora", [](const json& v) { return v.is_array() && v.empty(); }},
      {"post_sampling_probs", [](const json& v) { return v == false; }},
      {"return_tokens", [](const json& v) { return v == false; }},
      {"response_fields", [](const json& v) { return v.is_array() && v.empty(); }},
      // vLLM's and SGLang's.
      {"return_tokens_as_token_ids", [](const json& v) { return v == false; }},
      {"stream_reasoning", [](const json& v) { return v == true; }},
      {"no_stop_trim", [](const json& v) { return v == false; }},
      {"lora_path", [](const json&) { return false; }},
  };
  for (const Field& f : kFields) {
    if (const json* v = r.Get(f.key); v && !f.is_default(*v)) {
      r.Fail(f.key, std::string("'") + f.key + "' is not supported by this server (it would change the output)");
    }
  }
}

// Fields taken with any value because they change nothing the client receives as its
// answer: identity, billing and routing (user, metadata, store, service_tier,
// safety_identifier, prompt_cache_key, priority, request_id); hints about speed
// (prediction, cache_prompt, id_slot: every prefix is cached anyway); which backend
// enforces a constraint (guided_decoding_backend); llama-server's timing extras; and the
// settings of llama.cpp samplers that only act when their switch (mirostat,
// dynatemp_range, xtc_probability, dry_multiplier: RefuseUnimplementedSampling) is on.
void AcceptNoEffect(Reader& r) {
  static const char* const kKeys[] = {
      "user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "priority",
      "request_id", "prediction", "cache_prompt", "id_slot", "guided_decoding_backend", "timings_per_token",
      "return_progress", "mirostat_tau", "mirostat_eta", "dynatemp_exponent", "xtc_threshold", "dry_base",
      "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
  };
  for (const char* k : kKeys) r.Get(k);
}

// Options common to chat and completions. `chat`: logprobs is a boolean with
// top_logprobs; otherwise (legacy completions) logprobs is the number of top entries.
void ReadGeneration(Reader& r, std::string_view body, const ApiLimits& limits, bool chat, GenerationParams& g) {
  int64_t n = 1;
  if (r.Int("n", n, 1, 1000) && n != 1) r.Fail("n", "only n = 1 is supported");
  int64_t best_of = 1;
  if (!chat && r.Int("best_of", best_of, 1, 1000) && best_of != 1) r.Fail("best_of", "only best_of = 1 is supported");
  int64_t v = 0;
  // max_completion_tokens (chat) wins over the deprecated max_tokens; both are checked.
  if (r.Int("max_tokens", v, 1, limits.n_ctx)) g.max_tokens = static_cast<int>(v);
  if (chat && r.Int("max_completion_tokens", v, 1, limits.n_ctx)) g.max_tokens = static_cast<int>(v);
  // llama.cpp's name; -1: until the context is full.
  if (r.Int("n_predict", v, -1, limits.n_ctx)) {
    if (v == 0) {
      r.Fail("n_predict", "'n_predict' must be -1 (no limit) or at least 1, got 0");
    } else if (v > 0 && g.max_tokens && *g.max_tokens != v) {
      r.Fail("n_predict", "'n_predict' and 'max_tokens' disagree");
    } else if (v > 0) {
      g.max_tokens = static_cast<int>(v);
    }
  }
  bool window_given = false;
  for (const char* key : {"repeat_last_n", "penalty_last_n"}) {
    if (r.Int(key, v, -1, limits.n_ctx)) {
      g.repeat_last_n = static_cast<int>(v);
      window_given = true;
    }
  }
  r.Bool("ignore_eos", g.ignore_eos);
  r.Float("temperature", g.temperature, 0.0, 2.0);
  r.Float("top_p", g.top_p, 0.0, 1.0, /*lo_open=*/true);
  r.Float("min_p", g.min_p, 0.0, 1.0);
  r.Float("repeat_penalty", g.repeat_penalty, 0.0, 10.0, /*lo_open=*/true);
  // vLLM's and SGLang's repetition_penalty: the same rule (divide positive logits,
  // multiply negative ones, once per distinct token) over the whole sequence, prompt and
  // output, unless the client also gives llama.cpp's window.
  if (r.Get("repetition_penalty")) {
    float rep = 1.0f;
    const bool had = r.Get("repeat_penalty") != nullptr;
    r.Float("repetition_penalty", rep, 0.0, 10.0, /*lo_open=*/true);
    if (r.ok() && had && rep != g.repeat_penalty) {
      r.Fail("repetition_penalty", "'repetition_penalty' and 'repeat_penalty' disagree: give one");
    } else if (r.ok()) {
      g.repeat_penalty = rep;
      if (!window_given) g.repeat_last_n = -1;
    }
  }
  r.Float("presence_penalty", g.presence_penalty, -2.0, 2.0);
  r.Float("frequency_penalty", g.frequency_penalty, -2.0, 2.0);
  if (r.Int("top_k", v, 0, limits.n_vocab)) g.top_k = static_cast<int>(v);
  if (const json* s = r.Get("seed")) {
    if (!s->is_number_integer()) {
      r.Fail("seed", "'seed' must be an integer, got " + Describe(*s));
    } else {
      g.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
    }
  }
  if (const json* s = r.Get("stop")) {
    auto add = [&](const json& x) {
      if (!x.is_string()) return r.Fail("stop", "'stop' must be a string or an array of strings");
      const std::string& str = x.get_ref<const std::string&>();
      if (str.empty()) return r.Fail("stop", "stop strings must not be empty");
      if (str.size() > kMaxStopBytes) {
        return r.Fail("stop", "stop strings must be at most " + std::to_string(kMaxStopBytes) + " bytes");
      }
      g.stop.push_back(str);
    };
    if (s->is_array()) {
      if (s->size() > static_cast<size_t>(kMaxStops)) {
        r.Fail("stop", "at most " + std::to_string(kMaxStops) + " stop strings");
      } else {
        for (const json& x : *s) add(x);
      }
    } else {
      add(*s);
    }
  }
  if (chat) {
    r.Bool("logprobs", g.logprobs);
    if (r.Int("top_logprobs", v, 0, kMaxTopLogprobs)) {
      if (!g.logprobs) r.Fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      g.top_logprobs = static_cast<int>(v);
    }
  } else if (r.Int("logprobs", v, 0, 5)) {
    g.logprobs = true;
    g.top_logprobs = static_cast<int>(v);
  }
  r.Bool("stream", g.stream);
  if (const json* so = r.Get("stream_options")) {
    if (!so->is_object()) return r.Fail("stream_options", "'stream_options' must be an object");
    if (!g.stream) return r.Fail("stream_options", "'stream_options' is only allowed with 'stream': true");
    Reader sr(*so);
    sr.Bool("include_usage", g.include_usage);
    bool continuous = false;  // vLLM: usage in every chunk
    sr.Bool("continuous_usage_stats", continuous);
    if (continuous) sr.Fail("continuous_usage_stats", "'stream_options.continuous_usage_stats' is not supported (usage comes once, at the end)");
    sr.RefuseUnread("stream_options.");
    if (!sr.ok()) {
      const ApiError e = sr.error();
      r.Fail(e.param.starts_with("stream_options.") ? e.param : "stream_options." + e.param, e.message, e.code);
    }
  }
  ReadLogitBias(r, limits, g);
  ReadConstraint(r, body, g);
  if (g.grammar && g.ignore_eos) {
    r.Fail("ignore_eos", "'ignore_eos' with '" + g.grammar_param + "': a constrained answer ends with the end token");
  }
  RefuseUnimplementedSampling(r);
  RefuseUnsupported(r, chat);
  AcceptNoEffect(r);
  // vLLM's cache_salt: prefixes are shared only among requests with the same salt (and
  // API key).
  if (const json* cs = r.Get("cache_salt")) {
    if (!cs->is_string() || cs->get_ref<const std::string&>().empty() || cs->get_ref<const std::string&>().size() > 256) {
      r.Fail("cache_salt", "'cache_salt' must be a non-empty string of at most 256 bytes");
    } else {
      g.cache_salt = cs->get<std::string>();
    }
  }
}

Result<std::string> MessageContent(const json& c) {
  if (c.is_null()) return std::string();
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return InvalidArgument("message content must be a string or an array of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object()) return InvalidArgument("content parts must be objects");
    auto type = part.find("type");
    auto text = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return InvalidArgument("only content parts of type 'text' are supported");
    }
    if (text == part.end() || !text->is_string()) return InvalidArgument("a text content part needs a string 'text'");
    out += text->get_ref<const std::string&>();
  }
  return out;
}

// A client JSON value as a template value; strings are marked as input (content, never
// template text). Depth is bounded by the body's shape check.
jinja::Value ToTemplateValue(const json& v) {
  switch (v.type()) {
    case json::value_t::boolean: return jinja::Value::Bool(v.get<bool>());
    case json::value_t::number_integer: return jinja::Value::Int(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) ? jinja::Value::Int(static_cast<int64_t>(v.get<uint64_t>()))
                                                                   : jinja::Value::Float(v.get<double>());
    case json::value_t::number_float: return jinja::Value::Float(v.get<double>());
    case json::value_t::string: return jinja::Value::Str(v.get<std::string>(), /*input=*/true);
    case json::value_t::array: {
      jinja::ValueList l;
      for (const json& e : v) l.push_back(ToTemplateValue(e));
      return jinja::Value::List(std::move(l));
    }
    case json::value_t::object: {
      jinja::ValueDict d;
      for (const auto& [k, e] : v.items()) d.emplace_back(k, ToTemplateValue(e));
      return jinja::Value::Dict(std::move(d));
    }
    default: return jinja::Value::None();
  }
}


// JSON text as a template value with objects in the text's key order (what Hugging Face
// hands a template: Python dicts keep the client's order, and tojson writes it back). A
// repeated key keeps its first place and its last value, as Python's json.loads does.
// nullopt if the text is not JSON. Strings are input.
class TemplateValueBuilder {
 public:
  using J = nlohmann::json;
  bool null() { return Add(jinja::Value::None()); }
  bool boolean(bool b) { return Add(jinja::Value::Bool(b)); }
  bool number_integer(J::number_integer_t i) { return Add(jinja::Value::Int(i)); }
  bool number_unsigned(J::number_unsigned_t u) {
    return Add(u <= static_cast<uint64_t>(INT64_MAX) ? jinja::Value::Int(static_cast<int64_t>(u))
                                                      : jinja::Value::Float(static_cast<double>(u)));
  }
  bool number_float(J::number_float_t f, const J::string_t&) { return Add(jinja::Value::Float(f)); }
  bool string(J::string_t& s) { return Add(jinja::Value::Str(std::move(s), /*input=*/true)); }
  bool binary(J::binary_t&) { return false; }
  bool start_object(std::size_t) { return Open(jinja::Value::Dict()); }
  bool key(J::string_t& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(jinja::Value::List()); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  std::optional<jinja::Value> result;

 private:
  struct Frame {
    jinja::Value v;
    std::string key;
    std::unordered_map<std::string, size_t> index;  // dict: key -> position
  };
  bool Add(jinja::Value v) {
    if (stack_.empty()) {
      result = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (f.v.kind() == jinja::Value::Kind::kList) {
      f.v.list().push_back(std::move(v));
      return true;
    }
    auto [it, fresh] = f.index.emplace(f.key, f.v.dict().size());
    if (fresh) {
      f.v.dict().emplace_back(std::move(f.key), std::move(v));
    } else {
      f.v.dict()[it->second].second = std::move(v);
    }
    return true;
  }
  bool Open(jinja::Value v) {
    stack_.push_back({std::move(v), {}, {}});
    return true;
  }
  bool Close() {
    jinja::Value v = std::move(stack_.back().v);
    stack_.pop_back();
    return Add(std::move(v));
  }
  std::vector<Frame> stack_;
};

std::optional<jinja::Value> TemplateValueFromText(std::string_view text) {
  if (text.empty()) return std::nullopt;
  TemplateValueBuilder b;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &b);
  } catch (const nlohmann::json::exception&) {
    ok = false;
  }
  if (!ok) return std::nullopt;
  return std::move(b.result);
}


// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": a JSON string (OpenAI) or an object}}].
std::optional<ApiError> CheckToolCalls(const json& tc, const std::string& param) {
  if (!tc.is_array()) return Bad(param, "'" + param + "' must be an array of tool calls");
  if (tc.size() > kMaxTools) return Bad(param, "'" + param + "' holds at most " + std::to_string(kMaxTools) + " calls");
  for (size_t k = 0; k < tc.size(); ++k) {
    const std::string p = param + "[" + std::to_string(k) + "]";
    const json& c = tc[k];
    if (!c.is_object()) return Bad(p, p + " must be an object");
    if (auto id = c.find("id"); id != c.end() && !id->is_null() && !id->is_string()) return Bad(p + ".id", p + ".id must be a string");
    if (auto t = c.find("type"); t != c.end() && !t->is_null() && *t != "function") {
      return Bad(p + ".type", p + ".type must be \"function\"");
    }
    auto f = c.find("function");
    if (f == c.end() || !f->is_object()) return Bad(p + ".function", p + " needs a 'function' object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) return Bad(p + ".function.name", p + ".function.name must be a string");
    auto args = f->find("arguments");
    if (args != f->end() && !args->is_null() && !args->is_string() && !args->is_object()) {
      return Bad(p + ".function.arguments", p + ".function.arguments must be a string of JSON (or an object)");
    }
  }
  return std::nullopt;
}

// A tool call's function.arguments given as JSON text becomes the object it holds, for
// the template (text that is not a JSON object stays a string).
void ArgumentsAsObject(const jinja::Value& call) {
  const jinja::Value* f = call.Find("function");
  const jinja::Value* a = f ? f->Find("arguments") : nullptr;
  if (!a || a->kind() != jinja::Value::Kind::kString) return;
  std::optional<jinja::Value> v = TemplateValueFromText(a->text());
  if (v && v->kind() == jinja::Value::Kind::kDict) f->Set("arguments", std::move(*v));
}

bool ValidToolName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// tools (or the deprecated functions), tool_choice (function_call), parallel_tool_calls;
// each tool's parameters compiled to the grammar its calls are held to.
std::optional<ApiError> ReadTools(Reader& r, std::string_view body, ChatCompletionRequest& req) {
  const char* key = "tools";
  const json* tools = r.Get("tools");
  bool legacy = false;
  if (!tools || (tools->is_array() && tools->empty())) {
    tools = nullptr;
    if (const json* f = r.Get("functions"); f && !(f->is_array() && f->empty())) {
      tools = f;
      key = "functions";
      legacy = true;
    }
  }
  std::vector<const json*> params_dom;
  if (tools) {
    if (!tools->is_array()) return Bad(key, std::string("'") + key + "' must be an array");
    if (tools->size() > kMaxTools) {
      return Bad(key, std::string("'") + key + "' holds at most " + std::to_string(kMaxTools) + " tools");
    }
    std::optional<jinja::Value> ordered = TemplateValueFromText(RawMember(body, key));
    if (ordered && (ordered->kind() != jinja::Value::Kind::kList || ordered->list().size() != tools->size())) {
      ordered.reset();
    }
    jinja::ValueList for_template;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string param = std::string(key) + "[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) return Bad(param, param + " must be an object");
      const json* fn = &t;
      std::string fparam = param;
      if (!legacy) {
        auto type = t.find("type");
        if (type == t.end() || *type != "function") return Bad(param + ".type", param + ".type must be \"function\"");
        auto f = t.find("function");
        if (f == t.end() || !f->is_object()) return Bad(param + ".function", param + " needs a 'function' object");
        fn = &*f;
        fparam += ".function";
      }
      ToolDefinition def;
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !ValidToolName(name->get_ref<const std::string&>())) {
        return Bad(fparam + ".name", fparam + ".name must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -");
      }
      def.name = name->get<std::string>();
      for (const ToolDefinition& d : req.tools) {
        if (d.name == def.name) return Bad(fparam + ".name", "two tools are named '" + def.name + "'");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
        if (!d->is_string()) return Bad(fparam + ".description", fparam + ".description must be a string");
        def.description_bytes = d->get_ref<const std::string&>().size();
      }
      if (auto st = fn->find("strict"); st != fn->end() && !st->is_null()) {
        if (!st->is_boolean()) return Bad(fparam + ".strict", fparam + ".strict must be a boolean");
        def.strict = st->get<bool>();
      }
      jinja::Value tv = ordered ? ordered->list()[i] : ToTemplateValue(t);
      if (legacy) tv = jinja::Value::Dict({{"type", jinja::Value::Str("function")}, {"function", tv}});
      const json* pd = nullptr;
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object() && !p->is_boolean()) return Bad(fparam + ".parameters", fparam + ".parameters must be a JSON schema object");
        pd = &*p;
        const jinja::Value* f = tv.Find("function");
        const jinja::Value* pv = f ? f->Find("parameters") : nullptr;
        def.parameters = pv ? jinja::ToJson(*pv) : Dump(*p);
      }
      params_dom.push_back(pd);
      req.tools.push_back(std::move(def));
      for_template.push_back(std::move(tv));
    }
    req.tools_value = jinja::Value::List(std::move(for_template));
  }

  req.tool_choice = tools ? ToolChoice::kAuto : ToolChoice::kNone;
  const char* ckey = "tool_choice";
  const json* tc = r.Get("tool_choice");
  if (!tc && (tc = r.Get("function_call"))) ckey = "function_call";
  if (tc) {
    const std::string cparam = ckey;
    if (tc->is_string()) {
      const std::string& c = tc->get_ref<const std::string&>();
      if (c == "none") {
        req.tool_choice = ToolChoice::kNone;
      } else if (c == "auto") {
        req.tool_choice = tools ? ToolChoice::kAuto : ToolChoice::kNone;
      } else if (c == "required" && cparam == "tool_choice") {
        req.tool_choice = ToolChoice::kRequired;
      } else {
        return Bad(cparam, "'" + cparam + "' must be \"none\", \"auto\", \"required\" or a named function, got " + Describe(*tc));
      }
    } else if (tc->is_object()) {
      const json* f = tc;
      if (cparam == "tool_choice") {
        auto type = tc->find("type");
        auto fn = tc->find("function");
        if (type == tc->end() || *type != "function" || fn == tc->end() || !fn->is_object()) {
          return Bad(cparam, "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        f = &*fn;
      }
      auto name = f->find("name");
      if (name == f->end() || !name->is_string()) return Bad(cparam, "'" + cparam + "' names no function");
      req.tool_choice = ToolChoice::kNamed;
      req.tool_choice_name = name->get<std::string>();
      if (std::none_of(req.tools.begin(), req.tools.end(), [&](const ToolDefinition& d) { return d.name == req.tool_choice_name; })) {
        return Bad(cparam, "'" + cparam + "' names '" + Clip(req.tool_choice_name) + "', which is not among the tools");
      }
    } else {
      return Bad(cparam, "'" + cparam + "' must be a string or an object, got " + Describe(*tc));
    }
    if (req.tool_choice == ToolChoice::kRequired && !tools) {
      return Bad(cparam, "'" + cparam + "' is \"required\" but the request has no tools");
    }
  }
  r.Bool("parallel_tool_calls", req.parallel_tool_calls);

  // The grammars of the arguments, for the tools the answer may call.
  if (req.tool_choice != ToolChoice::kNone) {
    for (size_t i = 0; i < req.tools.size(); ++i) {
      ToolDefinition& d = req.tools[i];
      if (req.tool_choice == ToolChoice::kNamed && d.name != req.tool_choice_name) continue;
      const std::string param = std::string(key) + "[" + std::to_string(i) + "]" + (legacy ? "" : ".function") + ".parameters";
      if (!params_dom[i]) {  // no parameters: OpenAI's empty parameter list
        static const json kNoParameters = {{"type", "object"}, {"additionalProperties", false}};
        auto g = SchemaGrammar(param, kNoParameters);
        if (!g.ok()) return g.error();
        d.arguments = *g;
        continue;
      }
      auto g = SchemaGrammar(param, *params_dom[i], d.parameters);
      if (g.ok()) {
        d.arguments = *g;
      } else if (g.error().code != "unsupported_schema" || d.strict || req.tool_choice != ToolChoice::kAuto) {
        return g.error();
      }
      // Otherwise (auto, not strict, a keyword the converter lacks): the call's syntax is
      // held to, its arguments to any JSON object (docs/server.md).
    }
  }
  return std::nullopt;
}

template <typename T, typename F>
Parsed<T> Guard(F&& f) {
  // Every access above is type-checked; this only keeps a missed case from crossing the
  // layer. The exception's text is clipped: it may quote client data.
  try {
    return f();
  } catch (const std::exception& e) {
    return Bad("", "malformed request: " + Clip(e.what()));
  }
}

}  // namespace

std::optional<ApiError> CheckJsonShape(std::string_view body, const JsonShapeLimits& limits) {
  int depth = 0;
  size_t values = 1;  // the top-level value
  bool in_string = false;
  for (size_t i = 0; i < body.size();) {
    const unsigned char c = static_cast<unsigned char>(body[i]);
    if (c >= 0x80) {
      const size_t len = Utf8Length(body, i);
      if (len == 0) return Bad("", "the request body is not valid UTF-8 (at byte " + std::to_string(i) + ")");
      i += len;
      continue;
    }
    ++i;
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      // Raw control bytes are never valid JSON (inside strings they must be escaped), and a
      // raw NUL would end the parser's input early: refuse them here.
      return Bad("", "the request body holds a raw control byte (at byte " + std::to_string(i - 1) + ")");
    }
    if (in_string) {
      if (c == '"') {
        in_string = false;
      } else if (c == '\\' && i < body.size() && static_cast<unsigned char>(body[i]) < 0x80) {
        ++i;  // the escaped character (a non-ASCII one is invalid JSON; the parser says so)
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) {
          return Bad("", "the request body nests arrays/objects more than " + std::to_string(limits.max_depth) +
                             " levels deep");
        }
        [[fallthrough]];
      case ',':
        if (++values > limits.max_values) {
          return Bad("", "the request body holds more than " + std::to_string(limits.max_values) + " JSON values");
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return std::nullopt;
}

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Dump(json{{"error", err}});
}

// NUL characters (\u0000) in strings are accepted and kept: they are valid JSON and
// Unicode, and everything past the parser handles text as (pointer, length) — the
// tokenizer encodes U+0000 like any other character. Nothing truncates at a NUL.
// Reasoning switches of the three servers' clients, read into one setting: llama-server's
// reasoning_format (none / deepseek / auto), SGLang's separate_reasoning (false: the
// reasoning stays in content, as none), vLLM's include_reasoning (false: split off and
// dropped); and OpenAI's reasoning_effort, a variable for templates that read it (gpt-oss)
// unless chat_template_kwargs sets it.
void ReadReasoningFields(Reader& r, ChatCompletionRequest& req) {
  if (const json* f = r.Get("reasoning_format")) {
    if (!f->is_string() || (*f != "none" && *f != "deepseek" && *f != "auto")) {
      return r.Fail("reasoning_format", "'reasoning_format' must be \"none\", \"deepseek\" or \"auto\", got " + Describe(*f));
    }
    req.reasoning_format = *f == "none" ? "none" : "deepseek";
  }
  bool separate = true;
  r.Bool("separate_reasoning", separate);
  if (!separate) {
    if (req.reasoning_format == "deepseek") {
      return r.Fail("separate_reasoning", "'separate_reasoning': false and 'reasoning_format' disagree");
    }
    req.reasoning_format = "none";
  }
  r.Bool("include_reasoning", req.include_reasoning);
  if (const json* e = r.Get("reasoning_effort")) {
    if (!e->is_string() || (*e != "none" && *e != "minimal" && *e != "low" && *e != "medium" && *e != "high")) {
      return r.Fail("reasoning_effort",
                    "'reasoning_effort' must be one of none, minimal, low, medium, high, got " + Describe(*e));
    }
    const bool set = std::any_of(req.template_kwargs.begin(), req.template_kwargs.end(),
                                 [](const auto& kv) { return kv.first == "reasoning_effort"; });
    if (!set) req.template_kwargs.emplace_back("reasoning_effort", jinja::Value::Str(e->get<std::string>(), /*input=*/true));
  }
}

Parsed<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<ChatCompletionRequest>([&]() -> Parsed<ChatCompletionRequest> {
    json j;
    if (auto e = ParseObject(body, limits.json, j)) return *e;
    ChatCompletionRequest req;
    Reader r(j);
    std::optional<ApiError> not_found;
    ReadModel(r, limits, req.model, not_found);
    const json* msgs = r.Get("messages");
    if (r.ok() && (!msgs || !msgs->is_array() || msgs->empty())) {
      return Bad("messages", "'messages' must be a non-empty array");
    }
    size_t prompt_bytes = 0;
    // The messages in the client's key order, for the template (DOM: keys sorted).
    std::optional<jinja::Value> ordered;
    if (msgs) ordered = TemplateValueFromText(RawMember(body, "messages"));
    if (ordered && (ordered->kind() != jinja::Value::Kind::kList || ordered->list().size() != msgs->size())) {
      ordered.reset();
    }
    if (msgs) {
      for (size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        const std::string param = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return Bad(param, param + " must be an object");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string()) return Bad(param + ".role", param + ".role must be a string");
        const std::string& rs = role->get_ref<const std::string&>();
        if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer" && rs != "tool") {
          return Bad(param + ".role", "unsupported role '" + Clip(rs) + "' (system, developer, user, assistant, tool)");
        }
        if (auto fc = m.find("function_call"); fc != m.end() && !fc->is_null()) {
          return Bad(param + ".function_call", "'function_call' in messages is the deprecated form: send 'tool_calls'");
        }
        ChatMessage msg;
        msg.role = rs == "developer" ? "system" : rs;
        const bool has_calls = rs == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
                               !(m["tool_calls"].is_array() && m["tool_calls"].empty());
        if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !(tc->is_array() && tc->empty())) {
          if (rs != "assistant") return Bad(param + ".tool_calls", "only assistant messages hold 'tool_calls'");
          if (auto e = CheckToolCalls(*tc, param + ".tool_calls")) return *e;
          prompt_bytes += Dump(*tc).size();
        }
        if (rs == "tool") {
          auto id = m.find("tool_call_id");
          if (id != m.end() && !id->is_null() && !id->is_string()) {
            return Bad(param + ".tool_call_id", param + ".tool_call_id must be a string");
          }
        }
        auto content = m.find("content");
        if (content == m.end() || content->is_null()) {
          if (!has_calls) return Bad(param + ".content", param + " has no content");
          msg.content_null = true;
        } else {
          auto text = MessageContent(*content);
          if (!text.ok()) return Bad(param + ".content", text.status().message());
          msg.content = std::move(text).value();
        }
        prompt_bytes += msg.content.size();
        if (limits.max_prompt_bytes > 0 && prompt_bytes > limits.max_prompt_bytes) {
          return PromptTooLong("messages", prompt_bytes, limits);
        }
        // Everything else the client sent, for the template; tool-call arguments as
        // objects (templates write them with tojson, as vLLM and llama.cpp hand them over).
        const jinja::Value full = ordered ? ordered->list()[i] : ToTemplateValue(m);
        if (full.kind() == jinja::Value::Kind::kDict) {
          for (const auto& [k, v] : full.dict()) {
            if (k == "role" || k == "content") continue;
            if (k == "tool_calls" && v.kind() == jinja::Value::Kind::kList) {
              for (const jinja::Value& call : v.list()) ArgumentsAsObject(call);
            }
            msg.extra.emplace_back(k, v);
          }
        }
        req.messages.push_back(std::move(msg));
      }
    }
    if (auto e = ReadTools(r, body, req)) return *e;
    for (const ToolDefinition& t : req.tools) {
      prompt_bytes += t.parameters.size() + t.description_bytes;
      if (limits.max_prompt_bytes > 0 && prompt_bytes > limits.max_prompt_bytes) {
        return PromptTooLong("tools", prompt_bytes, limits);
      }
    }
    ReadGeneration(r, body, limits, /*chat=*/true, req.gen);
    if (r.ok() && req.gen.ignore_eos && req.tool_choice != ToolChoice::kNone && !req.tools.empty()) {
      return Bad("ignore_eos", "'ignore_eos' with tools: an answer of calls ends with the end token");
    }
    if (const json* kw = r.Get("chat_template_kwargs")) {
      if (!kw->is_object()) return Bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      if (kw->size() > kMaxTemplateKwargs) {
        return Bad("chat_template_kwargs", "'chat_template_kwargs' holds at most " + std::to_string(kMaxTemplateKwargs) + " entries");
      }
      for (const auto& [k, v] : kw->items()) {
        for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}) {
          if (k == reserved) {
            return Bad("chat_template_kwargs." + k, "'chat_template_kwargs' may not set the template's own '" + k + "'");
          }
        }
        req.template_kwargs.emplace_back(k, ToTemplateValue(v));
      }
    }
    ReadReasoningFields(r, req);
    bool flag = false;
    r.Bool("add_special_tokens", flag);  // vLLM: the template writes the special tokens
    if (flag) r.Fail("add_special_tokens", "'add_special_tokens' must be false for chat: the chat template writes them");
    flag = false;
    r.Bool("echo", flag);  // vLLM: the last message repeated in the answer
    if (flag) r.Fail("echo", "'echo' is not supported for chat completions");
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    if (not_found) return *not_found;
    return req;
  });
}

// Raw prompts are tokenized with special-token parsing on (server.cc): the client writes
// the whole prompt, there are no turns of someone else's to forge.
Parsed<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<CompletionRequest>([&]() -> Parsed<CompletionRequest> {
    json j;
    if (auto e = ParseObject(body, limits.json, j)) return *e;
    CompletionRequest req;
    Reader r(j);
    std::optional<ApiError> not_found;
    ReadModel(r, limits, req.model, not_found);
    const json* p = r.Get("prompt");
    if (r.ok() && !p) return Bad("prompt", "'prompt' is required");
    if (p) {
      const json* one = p;
      if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
        if (p->size() != 1) return Bad("prompt", "only one prompt per request is supported");
        one = &(*p)[0];
      }
      if (one->is_string()) {
        const std::string& text = one->get_ref<const std::string&>();
        if (limits.max_prompt_bytes > 0 && text.size() > limits.max_prompt_bytes) {
          return PromptTooLong("prompt", text.size(), limits);
        }
        req.prompt_text = text;
      } else if (one->is_array() && !one->empty()) {
        if (one->size() >= static_cast<size_t>(std::max(limits.n_ctx, 1))) {
          return Bad("prompt",
                     "this model's context is " + std::to_string(limits.n_ctx) + " tokens; the prompt has " +
                         std::to_string(one->size()) + " tokens",
                     "context_length_exceeded");
        }
        req.prompt_tokens.reserve(one->size());
        for (const json& t : *one) {
          if (!t.is_number_integer()) {
            return Bad("prompt", "'prompt' must be a string or an array of token ids, got " + Describe(t) + " in the array");
          }
          const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(limits.n_vocab)
                                                       : t.get<int64_t>() >= 0 && t.get<int64_t>() < limits.n_vocab;
          if (!in_range) {
            return Bad("prompt", "token id " + Describe(t) + " is outside the vocabulary (0.." +
                                     std::to_string(limits.n_vocab - 1) + ")");
          }
          req.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
      } else {
        return Bad("prompt", "'prompt' must be a string or a non-empty array of token ids");
      }
    }
    r.Bool("echo", req.echo);
    if (const json* s = r.Get("suffix"); s && !(s->is_string() && s->get_ref<const std::string&>().empty())) {
      r.Fail("suffix", "'suffix' is not supported");
    }
    ReadGeneration(r, body, limits, /*chat=*/false, req.gen);
    if (const json* kw = r.Get("chat_template_kwargs"); kw && !(kw->is_object() && kw->empty())) {
      return Bad("chat_template_kwargs", "'chat_template_kwargs' is for chat completions (a raw prompt has no template)");
    }
    r.Bool("add_special_tokens", req.add_special);  // vLLM: BOS before a text prompt
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    if (not_found) return *not_found;
    return req;
  });
}

Parsed<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<TokenizeRequest>([&]() -> Parsed<TokenizeRequest> {
    json j;
    if (auto e = ParseObject(body, limits.json, j)) return *e;
    TokenizeRequest req;
    Reader r(j);
    if (!r.Get("content")) return Bad("content", "'content' is required");
    r.String("content", req.content);
    r.Bool("add_special", req.add_special);
    r.Bool("with_pieces", req.with_pieces);
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    if (limits.max_prompt_bytes > 0 && req.content.size() > limits.max_prompt_bytes) {
      return Bad("content", "'content' holds " + std::to_string(req.content.size()) + " bytes; at most " +
                                std::to_string(limits.max_prompt_bytes) + " (what this model's context of " +
                                std::to_string(limits.n_ctx) + " tokens can hold)");
    }
    return req;
  });
}

Parsed<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  ApiLimits unlimited;
  unlimited.max_prompt_bytes = 0;
  return ParseTokenizeRequest(body, unlimited);
}

Parsed<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<DetokenizeRequest>([&]() -> Parsed<DetokenizeRequest> {
    json j;
    if (auto e = ParseObject(body, limits.json, j)) return *e;
    DetokenizeRequest req;
    Reader r(j);
    const json* t = r.Get("tokens");
    if (!t || !t->is_array()) return Bad("tokens", "'tokens' must be an array of token ids");
    req.tokens.reserve(t->size());
    for (const json& x : *t) {
      if (!x.is_number_integer() || (x.is_number_unsigned() ? x.get<uint64_t>() >= static_cast<uint64_t>(limits.n_vocab)
                                                              : (x.get<int64_t>() < 0 || x.get<int64_t>() >= limits.n_vocab))) {
        return Bad("tokens", "token " + Describe(x) + " is not an id in 0.." + std::to_string(limits.n_vocab - 1));
      }
      req.tokens.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    return req;
  });
}

// ---- responses ----------------------------------------------------------------------

namespace {

json UsageJson(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.cache) {
    const CacheUsage& c = *u.cache;
    json reasons = json::object();
    for (const auto& [why, n] : c.miss_reasons) reasons[why] = n;
    j["cache"] = {{"local", c.local},
                  {"store", c.store},
                  {"store_tiers", {{"memory", c.store_memory}, {"replica", c.store_replica}, {"ssd", c.store_ssd},
                                   {"remote", c.store_remote}}},
                  {"waited_for", c.waited_for},
                  {"computed", c.computed},
                  {"miss_reasons", std::move(reasons)}};
  }
  return j;
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json ChatLogprobs(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    json top = json::array();
    for (const TopLogprob& x : t.top) top.push_back({{"token", x.token}, {"logprob", x.logprob}, {"bytes", Bytes(x.token)}});
    content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Legacy completions format; text_offset counts token bytes from `offset` (see
// CompletionResponse::text_offset_base).
json CompletionLogprobs(const std::vector<TokenLogprob>& lps, size_t offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const TopLogprob& x : t.top) top[x.token] = x.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Envelope(Endpoint ep, bool chunk, const std::string& id, int64_t created, const std::string& model) {
  const char* object = ep == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"system_fingerprint", "trellis"}};
}

}  // namespace

std::string ResponseJson(const CompletionResponse& r) {
  json j = Envelope(r.endpoint, false, r.id, r.created, r.model);
  json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
  if (r.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    if (!r.reasoning.empty()) choice["message"]["reasoning_content"] = r.reasoning;
    if (!r.tool_calls.empty()) {
      if (r.text.empty()) choice["message"]["content"] = nullptr;
      json calls = json::array();
      for (const ToolCallOut& c : r.tool_calls) {
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      choice["message"]["tool_calls"] = std::move(calls);
    }
    if (r.with_logprobs) choice["logprobs"] = ChatLogprobs(r.logprobs);
  } else {
    choice["text"] = r.text;
    if (r.with_logprobs) choice["logprobs"] = CompletionLogprobs(r.logprobs, r.text_offset_base);
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(r.usage);
  return Dump(j);
}

std::string ChunkJson(const StreamChunk& c) {
  json j = Envelope(c.endpoint, true, c.id, c.created, c.model);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (c.finish_reason) choice["finish_reason"] = *c.finish_reason;
  if (c.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (c.role) delta["role"] = "assistant";
    if (c.role || !c.text.empty()) delta["content"] = c.text;
    if (!c.reasoning.empty()) delta["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      json calls = json::array();
      for (size_t i = 0; i < c.tool_calls.size(); ++i) {
        const ToolCallOut& t = c.tool_calls[i];
        const size_t index = t.index != SIZE_MAX ? t.index : c.tool_call_index + i;
        if (t.first) {
          calls.push_back({{"index", index}, {"id", t.id}, {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        } else {
          calls.push_back({{"index", index}, {"function", {{"arguments", t.arguments}}}});
        }
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = delta;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = ChatLogprobs(c.logprobs);
  } else {
    choice["text"] = c.text;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = CompletionLogprobs(c.logprobs, c.text_offset_base);
  }
  j["choices"] = json::array({choice});
  if (c.usage_null) j["usage"] = nullptr;
  return Dump(j);
}

size_t NextTextOffset(const StreamChunk& c) {
  size_t offset = c.text_offset_base;
  for (const TokenLogprob& t : c.logprobs) offset += t.token.size();
  return offset;
}

std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                           const Usage& u) {
  json j = Envelope(endpoint, true, id, created, model);
  j["choices"] = json::array();
  j["usage"] = UsageJson(u);
  return Dump(j);
}

std::string ModelsJson(const std::string& model_id, int64_t created, int n_ctx) {
  json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "trellis"},
            {"meta", {{"n_ctx", n_ctx}}}};
  return Dump(json{{"object", "list"}, {"data", json::array({m})}});
}

std::string TokenizeJson(const std::vector<int32_t>& ids, const std::vector<std::string>* pieces) {
  json tokens = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (pieces) {
      tokens.push_back({{"id", ids[i]}, {"piece", (*pieces)[i]}});
    } else {
      tokens.push_back(ids[i]);
    }
  }
  return Dump(json{{"tokens", tokens}});
}

std::string DetokenizeJson(const std::string& content) { return Dump(json{{"content", content}}); }

}  // namespace trellis::server
