#include "grammar/json_schema.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/stacks.h"

namespace trellis::grammar {
namespace {

using json = nlohmann::ordered_json;

Grammar CompileSchema(std::string_view schema) {
  auto g = CompileJsonSchema(schema);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << schema;
  return g.ok() ? std::move(*g) : Grammar{};
}

struct Case {
  const char* schema;
  std::vector<std::string> accept, reject;
};

TEST(JsonSchemaTest, AcceptsInstancesAndRejectsOthers) {
  const Case cases[] = {
      {R"~({"type": "integer"})~", {"0", "-12", "12345678901234567890"}, {"01", "1.5", "\"1\"", "123456789012345678901"}},
      {R"~({"type": "number"})~", {"0", "-1.25", "3e10", "2.5E-3"}, {".5", "1.", "+1", "1e1234"}},
      {R"~({"type": ["string", "null"]})~", {"\"a\"", "null"}, {"1", "nul"}},
      {R"~({"type": "string", "minLength": 2, "maxLength": 3})~", {"\"ab\"", "\"abc\"", "\"\\n\\u00e9\""}, {"\"a\"", "\"abcd\""}},
      {R"~({"enum": ["red", 1, null, {"a": [true]}]})~", {"\"red\"", "1", "null", "{\"a\":[true]}"}, {"\"blue\"", "2"}},
      {R"~({"type": "string", "enum": ["a", 1]})~", {"\"a\""}, {"1"}},
      {R"~({"const": "x\"y"})~", {"\"x\\\"y\""}, {"\"xy\""}},
      {R"~({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b"],
           "additionalProperties": false})~",
       {"{\"b\":\"x\"}", "{\"a\":1,\"b\":\"x\"}", "{ \"a\": 1, \"b\": \"x\" }", "{\n  \"b\": \"x\"\n}"},
       {"{}", "{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{\"b\":\"x\",\"c\":1}", "{\"b\":1}", "{\"b\":\"x\",}"}},
      // Additional properties allowed: any other key, never a declared one again.
      {R"~({"type": "object", "properties": {"id": {"type": "integer"}}})~",
       {"{}", "{\"id\":1}", "{\"id\":1,\"x\":true}", "{\"i\":2}", "{\"idx\":[]}", "{\"x\":1,\"y\":2}"},
       {"{\"id\":1,\"id\":2}", "{\"x\":1,\"id\":2}", "{\"id\":\"s\"}"}},
      {R"~({"type": "object", "additionalProperties": {"type": "boolean"}})~",
       {"{}", "{\"a\":true,\"b\":false}"},
       {"{\"a\":1}"}},
      {R"~({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})~",
       {"[1]", "[1,2,3]", "[ 1 , 2 ]"},
       {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"}},
      {R"~({"type": "array", "maxItems": 0})~", {"[]"}, {"[1]"}},
      {R"~({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})~",
       {"[]", "[\"a\"]", "[\"a\",1]"},
       {"[1]", "[\"a\",1,2]"}},
      {R"~({"prefixItems": [{"type": "string"}], "items": {"type": "null"}, "minItems": 2})~",
       {"[\"a\",null]", "[\"a\",null,null]"},
       {"[\"a\"]", "[\"a\",1]"}},
      {R"~({"anyOf": [{"type": "integer"}, {"type": "boolean"}]})~", {"1", "true"}, {"\"1\""}},
      {R"~({"oneOf": [{"type": "integer"}, {"type": "boolean"}, {"enum": ["x", null]}]})~", {"1", "true", "\"x\"", "null"}, {"\"y\""}},
      {R"~({"oneOf": [{"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"],
                        "additionalProperties": false},
                       {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind"],
                        "additionalProperties": false}]})~",
       {"{\"kind\":\"cat\",\"lives\":9}", "{\"kind\":\"dog\",\"good\":true}"}, {"{\"kind\":\"cat\",\"good\":true}"}},
      {R"~({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
           "required": ["v", "next"], "additionalProperties": false}}, "$ref": "#/$defs/node"})~",
       {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"},
       {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"}},
      {R"~({"type": "string", "format": "date-time"})~", {"\"2024-02-29T12:30:00Z\"", "\"1999-12-31T23:59:59.123+01:00\""}, {"\"2024-13-01T00:00:00Z\"", "\"x\""}},
      {R"~({"type": "string", "format": "uuid"})~", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567\""}},
      {R"~({"format": "ipv4"})~", {"\"192.168.0.1\""}, {"\"256.1.1.1\"", "\"01.1.1.1\""}},
      {R"~({"title": "anything", "description": "annotations only"})~", {"1", "\"s\"", "{\"a\":[null]}"}, {"tru"}},
      {R"~(true)~", {"[]"}, {""}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const Grammar g = CompileSchema(c.schema);
    if (g.rules.empty()) continue;
    for (const auto& s : c.accept) EXPECT_TRUE(Matches(g, s)) << "should accept " << s;
    for (const auto& s : c.reject) EXPECT_FALSE(Matches(g, s)) << "should reject " << s;
  }
}

// Bounded numbers against exact arithmetic: values are multiples of 1/10000, the
// candidates sit at and around every bound, each spelled with every number of fraction
// digits that writes it exactly ("1.1", "1.10", ...). The grammar must accept exactly the
// in-range spellings it can write: for "integer" the ones without a fraction.
TEST(JsonSchemaTest, BoundsAreExact) {
  constexpr int64_t kScale = 10000;
  auto text = [](int64_t v, int digits) {  // v / kScale with `digits` fraction digits
    const bool neg = v < 0;
    const int64_t a = neg ? -v : v;
    std::string s = (neg ? "-" : "") + std::to_string(a / kScale);
    if (digits > 0) {
      std::string f = std::to_string(a % kScale);
      f = std::string(4 - f.size(), '0') + f;
      s += "." + f.substr(0, digits);
    }
    return s;
  };
  auto spellings = [&](int64_t v) {
    std::vector<std::string> out;
    for (int d = 0; d <= 4; ++d) {
      int64_t unit = 1;
      for (int k = d; k < 4; ++k) unit *= 10;
      if (v % unit == 0) out.push_back(text(v, d));
    }
    if (v == 0) out.push_back("-0");
    return out;
  };
  // The shortest spelling, for the schema.
  auto shortest = [&](int64_t v) { return spellings(v).front() == "-0" ? "0" : spellings(v).back(); };
  const std::vector<int64_t> bounds = {-12340000, -105000, -30000, -20500, -2500, 0, 1250, 11000, 70000, 2345600, 10000000};
  std::set<int64_t> values = {0};
  for (int64_t b : bounds) {
    for (int64_t d : {0, 1, 10, 100, 1000, 9999, 10000, 90000, 100000}) {
      values.insert(b + d);
      values.insert(b - d);
    }
  }
  // Pairs of bounds (or none), inclusive or exclusive, for both types.
  std::vector<std::optional<int64_t>> ends = {std::nullopt};
  for (int64_t b : bounds) ends.push_back(b);
  int schemas = 0;
  for (size_t a = 0; a < ends.size(); ++a) {
    for (size_t b = 0; b < ends.size(); ++b) {
      const auto lo = ends[a], hi = ends[b];
      if (lo && hi && *lo > *hi) continue;
      for (int strict = 0; strict < 4; ++strict) {
        const bool ls = strict & 1, hs = strict & 2;
        if ((!lo && ls) || (!hi && hs)) continue;
        const bool empty = lo && hi && *lo == *hi && (ls || hs);
        for (const char* type : {"number", "integer"}) {
          json schema = {{"type", type}};
          if (lo) schema[ls ? "exclusiveMinimum" : "minimum"] = json::parse(shortest(*lo));
          if (hi) schema[hs ? "exclusiveMaximum" : "maximum"] = json::parse(shortest(*hi));
          SCOPED_TRACE(schema.dump());
          auto g = CompileJsonSchema(schema.dump());
          const bool integer = std::string(type) == "integer";
          bool any = false;
          for (int64_t v : values) {
            const bool in = (!lo || (ls ? v > *lo : v >= *lo)) && (!hi || (hs ? v < *hi : v <= *hi));
            for (const std::string& sp : spellings(v)) {
              const bool want = in && (!integer || sp.find('.') == std::string::npos);
              any = any || want;
              if (!g.ok()) continue;
              if (sp == "-0") {  // zero spelled negative: may be written only where 0 is in range
                EXPECT_TRUE(in || !Matches(*g, sp));
                continue;
              }
              EXPECT_EQ(Matches(*g, sp), want) << sp;
            }
          }
          if (empty || (!any && integer && lo && hi)) {
            if (!g.ok()) {
              EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << g.status().message();
            }
          } else {
            EXPECT_TRUE(g.ok()) << g.status().message();
          }
          ++schemas;
        }
      }
    }
  }
  EXPECT_GT(schemas, 300);
  // Exponents are not written where bounds apply; bounds may be spelled with them.
  auto none = CompileJsonSchema(R"~({"type": "number", "minimum": 1.5e1, "exclusiveMaximum": 2e-3})~");
  ASSERT_FALSE(none.ok());  // 15 > 0.002: no number
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  const Grammar small = CompileSchema(R"~({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-3})~");
  for (const char* s : {"0.001", "0.0005", "0.00099999"}) EXPECT_TRUE(Matches(small, s)) << s;
  for (const char* s : {"0", "0.0", "0.0011", "1e-4", "-0.0001"}) EXPECT_FALSE(Matches(small, s)) << s;
  // Draft 4: exclusiveMinimum / exclusiveMaximum as booleans beside the bound.
  const Grammar d4 = CompileSchema(R"~({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 3, "exclusiveMaximum": false})~");
  for (const char* s : {"1", "2", "3"}) EXPECT_TRUE(Matches(d4, s)) << s;
  for (const char* s : {"0", "4", "-1"}) EXPECT_FALSE(Matches(d4, s)) << s;
  // A bound past the grammar's 20 integer digits holds for every number it writes.
  const Grammar wide = CompileSchema(R"~({"type": "integer", "minimum": -1e30, "maximum": 1e30})~");
  for (const char* s : {"0", "-99999999999999999999", "99999999999999999999"}) EXPECT_TRUE(Matches(wide, s)) << s;
}

// multipleOf: every spelling (0 to 4 fraction digits, trailing zeros included) of the
// values v / 1000 for v in [-3000, 3000] is accepted exactly when it is a multiple of k,
// by exact integer arithmetic, for integer and fractional k, typed "number", "integer"
// or untyped, and with minimum 0.
TEST(JsonSchemaTest, MultipleOfIsExact) {
  struct K {
    const char* text;
    int64_t p;
    int q;  // k = p / 10^q
  };
  const K ks[] = {{"1", 1, 0},     {"2", 2, 0},     {"5", 5, 0},      {"3", 3, 0},     {"7", 7, 0},
                  {"12", 12, 0},   {"100", 100, 0}, {"0.5", 5, 1},    {"0.25", 25, 2}, {"0.01", 1, 2},
                  {"0.1", 1, 1},   {"2.5", 25, 1},  {"0.003", 3, 3},  {"0.125", 125, 3}, {"1.5", 15, 1}};
  auto spell = [](int64_t v, int digits) {
    const int64_t a = v < 0 ? -v : v;
    std::string s = (v < 0 ? "-" : "") + std::to_string(a / 1000);
    if (digits > 0) {
      std::string f = std::to_string(a % 1000);
      f = std::string(3 - f.size(), '0') + f + "0";
      s += "." + f.substr(0, digits);
    }
    return s;
  };
  int checked = 0;
  for (const K& k : ks) {
    for (const char* type : {"number", "integer", ""}) {
      for (bool min0 : {false, true}) {
        json schema = {{"multipleOf", json::parse(k.text)}};
        if (*type) schema["type"] = type;
        if (min0) schema["minimum"] = 0;
        SCOPED_TRACE(schema.dump());
        auto g = CompileJsonSchema(schema.dump());
        ASSERT_TRUE(g.ok()) << g.status().ToString();
        const bool integer = std::string(type) == "integer";
        int64_t scale = 1;
        for (int i = 0; i < k.q; ++i) scale *= 10;
        for (int64_t v = -3000; v <= 3000; v += (v > -40 && v < 40) ? 1 : 7) {
          const bool multiple = (v * scale) % (1000 * k.p) == 0 && (!min0 || v >= 0);
          for (int d = 0; d <= 4; ++d) {
            int64_t unit = 1;
            for (int i = d; i < 3; ++i) unit *= 10;
            if (d < 3 && v % unit != 0) continue;  // not spelled with d digits
            const std::string sp = spell(v, d);
            if (sp == "-0" || sp.rfind("-0.", 0) == 0) {
              if (v == 0) continue;  // zero spelled negative: either way is right
            }
            const bool want = multiple && (!integer || d == 0);
            EXPECT_EQ(Matches(*g, sp), want) << sp;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 50000);
  // Not a number above 0: refused as invalid.
  for (const char* bad : {R"~({"multipleOf": 0})~", R"~({"multipleOf": -2})~", R"~({"multipleOf": "2"})~"}) {
    auto g = CompileJsonSchema(bad);
    ASSERT_FALSE(g.ok()) << bad;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(JsonSchemaTest, RefusesWhatItDoesNotImplementNamingTheKeyword) {
  const std::pair<const char*, const char*> unsupported[] = {
      {R"~({"type": "string", "pattern": "^a+$", "maxLength": 3})~", "'pattern' with 'format', 'minLength' or 'maxLength'"},
      {R"~({"properties": {"s": {"type": "string", "pattern": "(?=a)a"}}})~", "'pattern' at '/properties/s': regular expression: lookahead"},
      {R"~({"type": "integer", "minimum": 1e50})~", "'minimum' 1e+50 at '' has more than 40 digits"},
      {R"~({"properties": {"n": {"type": "number", "multipleOf": 2, "maximum": 9}}})~", "'multipleOf' together with 'maximum' at '/properties/n'"},
      {R"~({"type": "number", "multipleOf": 0.0001234567})~", "more than 2048 states"},
      {R"~({"type": "array", "uniqueItems": true})~", "'uniqueItems'"},
      {R"~({"not": {"type": "null"}})~", "'not'"},
            {R"~({"$ref": "http://example.com/schema"})~", "only references inside the schema"},
      {R"~({"type": "string", "format": "hostname"})~", "'format' \"hostname\""},
      {R"~({"type": "object", "minProperties": 1})~", "'minProperties'"},
      {R"~({"oneOf": [{"type": "number"}, {"type": "integer"}]})~", "may both match"},
      {R"~({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}}, {"type": "object"}]})~", "may both match"},
      {R"~({"anyOf": [{"type": "string", "minLength": 2}], "minLength": 1})~", "both beside and inside"},
      {R"~({"allOf": [{"type": "string"}, {"type": "string"}]})~", "more than one part of 'allOf'"},
      // Found by the grammar fuzzer (UBSan): a count far beyond int64 is an integer too,
      // and is refused as a count, not cast.
      {R"~({"type": "array", "items": {"enum": ["x", 1, null]}, "maxItems": 7.77e107})~", "'maxItems' 7.77e+107 at '' is above"},
  };
  for (auto [schema, want] : unsupported) {
    auto g = CompileJsonSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), StatusCode::kUnsupported) << schema << ": " << g.status().message();
    EXPECT_NE(g.status().message().find(want), std::string::npos) << schema << ": " << g.status().message();
  }
  const std::pair<std::string, const char*> invalid[] = {
      {"{", "not valid JSON"},
      {"false", "no value is valid"},
      {"3", "must be an object or a boolean"},
      {R"~({"type": "strin"})~", "unknown type"},
      {R"~({"enum": []})~", "non-empty"},
      {R"~({"$ref": "#/$defs/missing"})~", "names no definition"},
      {R"~({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})~", "can never match"},
      {R"~({"type": "array", "minItems": 3, "maxItems": 2})~", "below"},
      {R"~({"type": "array", "items": false, "minItems": 1})~", "more items"},
      {std::string(200, '[') + std::string(200, ']'), "nested deeper"},
      {[] {
         std::string s = "{}";
         for (int i = 0; i < 100; ++i) s = "{\"items\": " + s + "}";
         return s;
       }(),
       "nested deeper"},
  };
  for (const auto& [schema, want] : invalid) {
    auto g = CompileJsonSchema(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << schema << ": " << g.status().message();
    EXPECT_NE(g.status().message().find(want), std::string::npos) << schema << ": " << g.status().message();
  }
}

TEST(JsonSchemaTest, JsonModeGrammars) {
  auto value = ParseGbnf(JsonValueGbnf());
  auto object = ParseGbnf(JsonObjectGbnf());
  ASSERT_TRUE(value.ok() && object.ok());
  EXPECT_TRUE(Matches(*value, "[1,{\"a\":\"\\u00e9\"},null]"));
  EXPECT_TRUE(Matches(*object, "{\"a\":{\"b\":[]}}"));
  EXPECT_FALSE(Matches(*object, "[1]"));
  EXPECT_FALSE(Matches(*object, "{\"a\":1,}"));
}

// Keys of `instance` in the order `schema` declares them (declared first, in order), as
// the grammar writes objects; recursing where the schema says what the values are.
json Canonical(const json& instance, const json& schema, const json& root, int depth = 0) {
  if (depth > 50 || !schema.is_object()) return instance;
  if (schema.contains("$ref") && schema["$ref"].is_string()) {
    const std::string r = schema["$ref"];
    if (r == "#") return Canonical(instance, root, root, depth + 1);
    for (const char* defs : {"definitions", "$defs"}) {
      const std::string p = std::string("#/") + defs + "/";
      if (r.rfind(p, 0) == 0 && root.contains(defs) && root[defs].contains(r.substr(p.size()))) {
        return Canonical(instance, root[defs][r.substr(p.size())], root, depth + 1);
      }
    }
    return instance;
  }
  if (schema.contains("const") && schema["const"].is_object() && instance.is_object()) {
    // The grammar writes the const's keys in the const's order.
    json out = json::object();
    for (const auto& [k, v] : schema["const"].items()) {
      if (instance.contains(k)) out[k] = instance[k];
    }
    for (const auto& [k, v] : instance.items()) {
      if (!out.contains(k)) out[k] = v;
    }
    return out;
  }
  if (instance.is_object()) {
    json out = json::object();
    const json props = schema.value("properties", json::object());
    if (props.is_object()) {
      for (const auto& [k, s] : props.items()) {
        if (instance.contains(k)) out[k] = Canonical(instance[k], s, root, depth + 1);
      }
    }
    for (const auto& [k, v] : instance.items()) {
      if (!out.contains(k)) out[k] = schema.contains("additionalProperties") ? Canonical(v, schema["additionalProperties"], root, depth + 1) : v;
    }
    return out;
  }
  if (instance.is_array() && schema.contains("items") && schema["items"].is_object()) {
    json out = json::array();
    for (const json& v : instance) out.push_back(Canonical(v, schema["items"], root, depth + 1));
    return out;
  }
  return instance;
}

// Whether `data` has the type the converter infers for an untyped schema from its
// keywords (object for properties, array for items, string for lengths): where it does
// not, the schema also admits it but the grammar, which writes the inferred type, does not.
bool InferredTypeHolds(const json& schema, const json& data) {
  if (!schema.is_object() || schema.contains("type")) return true;
  auto has = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return schema.contains(k); });
  };
  const bool obj = has({"properties", "required", "additionalProperties"});
  const bool arr = has({"items", "prefixItems", "additionalItems", "minItems", "maxItems"});
  const bool str = has({"minLength", "maxLength", "format", "pattern"});
  const bool num = has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"});
  if (!obj && !arr && !str && !num) return true;
  return (obj && data.is_object()) || (arr && data.is_array()) || (str && data.is_string()) || (num && data.is_number());
}

// Debian's json-schema-test-suite, draft 7, the files of the keywords this converter
// implements: each schema either compiles, and then accepts every valid instance and
// rejects every invalid one, or is refused as Unsupported. Deviations are listed below
// with their reason; nothing else may differ.
TEST(JsonSchemaTest, OfficialTestSuiteDraft7) {
  const std::filesystem::path dir = "/usr/share/json-schema-test-suite/tests/draft7";
  ASSERT_TRUE(std::filesystem::exists(dir)) << dir << " is missing: apt-get install json-schema-test-suite";
  // (group description, test description) whose outcome differs, and why.
  const std::set<std::pair<std::string, std::string>> deviations = {
      // The type is inferred one level down: "#" is an untyped object schema, so the
      // grammar writes an object where the schema also admits false.
      {"root pointer ref", "match"},
      {"root pointer ref", "recursive match"},
  };
  std::set<std::pair<std::string, std::string>> seen;
  int compiled = 0, refused = 0, checked = 0;
  for (const char* file : {"type", "enum", "const", "properties", "required", "additionalProperties", "items",
                           "maxItems", "minItems", "maxLength", "minLength", "pattern",
                           "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "ref", "definitions",
                           "boolean_schema", "default"}) {
    std::ifstream in(dir / (std::string(file) + ".json"));
    ASSERT_TRUE(in) << file;
    const json groups = json::parse(in);
    for (const json& group : groups) {
      const std::string gdesc = group["description"];
      const std::string schema = group["schema"].dump();
      auto g = CompileJsonSchema(schema);
      if (!g.ok()) {
        // Refused for a keyword it does not implement, or as a schema nothing satisfies
        // (then every instance of the group must be invalid); never for one it misreads.
        const bool none_valid = std::none_of(group["tests"].begin(), group["tests"].end(),
                                             [](const json& t) { return t["valid"].get<bool>(); });
        if (g.status().code() != StatusCode::kUnsupported) {
          EXPECT_TRUE(none_valid && g.status().code() == StatusCode::kInvalidArgument)
              << file << ": " << gdesc << ": " << g.status().message();
        }
        ++refused;
        if (getenv("SUITE_VERBOSE")) fprintf(stderr, "refused %s: %s: %s\n", file, gdesc.c_str(), g.status().message().c_str());
        continue;
      }
      ++compiled;
      for (const json& t : group["tests"]) {
        const std::string tdesc = t["description"];
        const bool valid = t["valid"];
        const std::string text = Canonical(t["data"], group["schema"], group["schema"]).dump();
        const bool got = Matches(*g, text);
        ++checked;
        if (deviations.count({gdesc, tdesc})) {
          // A listed deviation must still deviate: the list cannot hide a fixed case.
          EXPECT_NE(got, valid) << "listed deviation now agrees: " << gdesc << ": " << tdesc;
          seen.insert({gdesc, tdesc});
          continue;
        }
        if (valid) {
          // The grammar's language may be smaller where the schema says nothing about a
          // type it infers (a "properties" schema also admits non-objects).
          if (!got && !InferredTypeHolds(group["schema"], t["data"])) continue;
          EXPECT_TRUE(got) << file << ": " << gdesc << ": " << tdesc << ": " << text;
        } else {
          EXPECT_FALSE(got) << file << ": " << gdesc << ": " << tdesc << ": " << text;
        }
      }
    }
  }
  for (const auto& d : deviations) EXPECT_TRUE(seen.count(d)) << "listed deviation not in the suite: " << d.first << ": " << d.second;
  EXPECT_GE(compiled, 46);
  EXPECT_GE(checked, 174);
  RecordProperty("compiled", compiled);
  RecordProperty("refused", refused);
}

}  // namespace
}  // namespace trellis::grammar
