// Every field of a request is implemented, refused with 400 naming it, or one that changes
// nothing the client receives (AcceptNoEffect); the readers note each field they read, and
// Reader::RefuseUnread refuses the rest, so a field this server does not know is never
// dropped. Fields not implemented are refused unless they hold their no-op value
// (RefuseUnimplementedSampling) or always (RefuseUnsupported). Output constraints
// (response_format, grammar, json_schema, guided_*, ...): ReadConstraint. The lists, by
// kind: docs/server.md, "Every field is implemented, refused, or changes nothing".
#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <exception>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "server/api_reader.h"

namespace trellis::server {

using namespace api_detail;

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
    r.Bool("parse_special", req.parse_special);
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


}  // namespace trellis::server
