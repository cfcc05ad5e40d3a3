// The request fields chat and completion requests share: model, the generation and
// sampling fields, output constraints (response_format, grammar, json_schema, guided_*,
// ...: ReadConstraint), and the fields refused or accepted without effect.
#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <map>

#include "grammar/json_schema.h"
#include "grammar/regex.h"

#include "server/api_reader.h"

namespace trellis::server {
namespace api_detail {

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

Parsed<std::shared_ptr<const grammar::Grammar>> SchemaGrammar(const std::string& param, const json& v,
                                                              std::string_view raw) {
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

}  // namespace api_detail

}  // namespace trellis::server
