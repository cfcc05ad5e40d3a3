// Internal to the server's request parsers (api*.cc), not part of its interface: the
// Reader that notes each field a parser reads and refuses the rest, the error helpers,
// and the field readers the chat and completion parsers share (api_fields.cc, api_chat.cc).
#pragma once

#include <optional>
#include <string>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api.h"

namespace trellis::server::api_detail {

using json = nlohmann::json;

// Model output and token pieces may hold partial UTF-8: replace, never throw.
inline std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

inline ApiError Bad(std::string param, std::string message, std::string code = "") {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// Length of the well-formed UTF-8 sequence starting at s[i] (Unicode table 3-7: no
// overlongs, no surrogates, nothing above U+10FFFF), or 0 if it is ill-formed.
inline size_t Utf8Length(std::string_view s, size_t i) {
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
inline std::string Clip(std::string_view s) {
  if (s.size() <= kMaxEchoBytes) return std::string(s);
  size_t n = kMaxEchoBytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// A client value in an error message. Never dump() it: a deep value would recurse and a
// large one bloat the message. (J: json, or ordered_json for the dialects that keep key order.)
template <typename J>
std::string Describe(const J& v) {
  switch (v.type()) {
    case J::value_t::number_integer:
    case J::value_t::number_unsigned:
    case J::value_t::number_float:
    case J::value_t::boolean:
    case J::value_t::null: return v.dump();  // bounded: at most ~25 characters
    case J::value_t::string: return "the string '" + Clip(v.template get_ref<const std::string&>()) + "'";
    case J::value_t::array: return "an array";
    case J::value_t::object: return "an object";
    default: return std::string("a ") + v.type_name();
  }
}

// Reads optional fields of one JSON object with type and range checks. The first error
// sticks; later reads are no-ops. null counts as absent (the OpenAI API allows it).
template <typename json>
class BasicReader {
 public:
  explicit BasicReader(const json& obj) : obj_(obj) {}
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
      out = v->template get<bool>();
    }
  }
  void String(const char* key, std::string& out) {
    if (const json* v = Get(key)) {
      if (!v->is_string()) return Fail(key, std::string("'") + key + "' must be a string, got " + Describe(*v));
      out = v->template get<std::string>();
    }
  }
  // A float in [lo, hi] (lo excluded if lo_open).
  void Float(const char* key, float& out, double lo, double hi, bool lo_open = false) {
    if (const json* v = Get(key)) {
      if (!v->is_number()) return Fail(key, std::string("'") + key + "' must be a number, got " + Describe(*v));
      const double d = v->template get<double>();
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
      if (v->is_number_unsigned() ? v->template get<uint64_t>() > static_cast<uint64_t>(hi) : v->template get<int64_t>() > hi) {
        Fail(key, std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + Describe(*v));
        return false;
      }
      const int64_t x = v->is_number_unsigned() ? static_cast<int64_t>(v->template get<uint64_t>()) : v->template get<int64_t>();
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
using Reader = BasicReader<json>;

// The shape check, then the DOM. Parse errors are reported by position, never with the
// parser's message (it quotes the last token read, which may be megabytes long).
inline std::optional<ApiError> ParseObject(std::string_view body, const JsonShapeLimits& shape, json& out) {
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

// Shared field readers (api_fields.cc).
void ReadModel(Reader& r, const ApiLimits& limits, std::string& model, std::optional<ApiError>& not_found);
ApiError PromptTooLong(const char* param, size_t bytes, const ApiLimits& limits);
void RefuseUnsupported(Reader& r, bool chat);
void ReadGeneration(Reader& r, std::string_view body, const ApiLimits& limits, bool chat, GenerationParams& g);
// A grammar from a JSON schema (an object or boolean, or JSON text of one); the error names
// `param`. `raw`: the value's source text when known, so the schema keeps the client's key order
// (the parsed value's objects are sorted by key), which is the order the answer writes
// properties in.
Parsed<std::shared_ptr<const grammar::Grammar>> SchemaGrammar(const std::string& param, const json& v,
                                                              std::string_view raw = {});
// The source text of member `key` of the JSON object text `obj` (valid JSON: the body
// was parsed), or empty if absent. A key written with escapes is not found (the caller
// then falls back to the parsed value).
std::string_view RawMember(std::string_view obj, std::string_view key);

// The cache receipt (usage.cache: where the prompt's K/V came from, docs/store.md "Receipt") added to
// a usage object, in every dialect (api_response.cc).
void AddCacheReceipt(const Usage& u, json& usage);

// ---- the other dialects (api_dialects.cc) ----

// Objects keep the client's key order (schemas are written in it; templates see it).
using ojson = nlohmann::ordered_json;
using OReader = BasicReader<ojson>;
inline std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }
// The shape check, then an ordered DOM of an object, as ParseObject.
std::optional<ApiError> ParseOrdered(std::string_view body, const JsonShapeLimits& shape, ojson& out);
// An error's field renamed from the OpenAI chat body's to the dialect's: the first
// (OpenAI prefix, dialect prefix) pair that matches, in param and message.
using Renames = std::vector<std::pair<std::string, std::string>>;
ApiError Rename(ApiError e, const Renames& renames);
// The chat request an OpenAI body built by a dialect translates to; errors renamed.
Parsed<ChatCompletionRequest> ChatFromOpenAi(const ojson& body, const ApiLimits& limits, const Renames& renames);
// Text of a dialect's content: a string, or an array of {"type": one of `types`, "text"}
// parts, joined. Other part types are refused, naming them.
Result<std::string> TextParts(const ojson& c, std::initializer_list<const char*> types);

}  // namespace trellis::server::api_detail
