#include "server/tool_calls.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

namespace trellis::server {

std::string_view TrimSpace(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

namespace {

using ojson = nlohmann::ordered_json;  // a call's arguments keep the model's key order

bool Contains(std::string_view s, std::string_view x) { return s.find(x) != std::string_view::npos; }

ojson Parse(std::string_view text) { return ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false); }

// One call from its JSON object, or false.
bool ReadCall(const ojson& j, const char* args_key, ParsedToolCall& out) {
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  auto args = j.find(args_key);
  if (args == j.end()) args = j.find("arguments");
  ojson a = ojson::object();
  if (args != j.end()) {
    if (args->is_string()) {
      a = Parse(args->get_ref<const std::string&>());
    } else {
      a = *args;
    }
  }
  if (!a.is_object()) return false;
  out.name = name->get<std::string>();
  out.arguments = a.dump(-1, ' ', false, ojson::error_handler_t::replace);
  return true;
}

// A JSON array of calls (mistral, phi4), or false.
bool ReadCallArray(std::string_view text, std::vector<ParsedToolCall>& out) {
  const ojson j = Parse(TrimSpace(text));
  if (!j.is_array() || j.empty()) return false;
  std::vector<ParsedToolCall> calls;
  for (const ojson& e : j) {
    ParsedToolCall c;
    if (!ReadCall(e, "arguments", c)) return false;
    calls.push_back(std::move(c));
  }
  out.insert(out.end(), calls.begin(), calls.end());
  return true;
}

// Blocks between `open` and `close` (close may be absent at the very end); each block's
// body parsed by `read`; text outside, and blocks that do not parse, are content.
template <typename F>
ParsedAnswer Blocks(std::string_view text, std::string_view open, std::string_view close, F&& read) {
  ParsedAnswer out;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t b = text.find(open, pos);
    if (b == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, b - pos);
    const size_t body = b + open.size();
    size_t e = close.empty() ? std::string_view::npos : text.find(close, body);
    const size_t body_end = e == std::string_view::npos ? text.size() : e;
    const size_t next = e == std::string_view::npos ? text.size() : e + close.size();
    if (!read(text.substr(body, body_end - body), out.calls)) content += text.substr(b, next - b);
    pos = next;
  }
  out.content = std::string(TrimSpace(content));
  return out;
}

}  // namespace

ToolCallFormat DetectToolCallFormat(std::string_view src) {
  if (Contains(src, "<tool_call>")) return ToolCallFormat::kHermes;
  if (Contains(src, "[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  // Phi-4-mini's template names only <|tool|> (the definitions); its model answers with
  // <|tool_call|>[...]<|/tool_call|>.
  if (Contains(src, "<|tool_call|>") || Contains(src, "<|tool|>")) return ToolCallFormat::kPhi4;
  if (Contains(src, "<|python_tag|>") || (Contains(src, "ipython") && Contains(src, "parameters"))) return ToolCallFormat::kLlama3;
  return ToolCallFormat::kGeneric;
}

const char* ToolCallFormatName(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kGeneric: return "generic";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3: return "llama3";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kPhi4: return "phi4";
  }
  return "?";
}

std::string_view ToolCallTrigger(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "<tool_call>";
    case ToolCallFormat::kMistral: return "[TOOL_CALLS]";
    case ToolCallFormat::kPhi4: return "<|tool_call|>";
    case ToolCallFormat::kLlama3:
    case ToolCallFormat::kGeneric: return "";
  }
  return "";
}

std::vector<std::string_view> ToolCallMarkers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::kMistral: return {"[TOOL_CALLS]"};
    case ToolCallFormat::kPhi4: return {"<|tool_call|>", "<|/tool_call|>"};
    case ToolCallFormat::kLlama3: return {"<|python_tag|>"};
    case ToolCallFormat::kGeneric: break;
  }
  return {};
}

ParsedAnswer ParseToolCalls(ToolCallFormat f, std::string_view text) {
  switch (f) {
    case ToolCallFormat::kHermes:
      return Blocks(text, "<tool_call>", "</tool_call>", [](std::string_view body, std::vector<ParsedToolCall>& calls) {
        ParsedToolCall c;
        if (!ReadCall(Parse(TrimSpace(body)), "arguments", c)) return false;
        calls.push_back(std::move(c));
        return true;
      });
    case ToolCallFormat::kMistral:
      return Blocks(text, "[TOOL_CALLS]", "", [](std::string_view body, std::vector<ParsedToolCall>& calls) {
        return ReadCallArray(body, calls);
      });
    case ToolCallFormat::kPhi4:
      return Blocks(text, "<|tool_call|>", "<|/tool_call|>", [](std::string_view body, std::vector<ParsedToolCall>& calls) {
        return ReadCallArray(body, calls);
      });
    case ToolCallFormat::kLlama3: {
      // The whole answer: one or more JSON calls separated by ';', maybe after the tag.
      std::string_view t = TrimSpace(text);
      if (t.starts_with("<|python_tag|>")) t = TrimSpace(t.substr(14));
      ParsedAnswer out;
      size_t pos = 0;
      while (pos <= t.size()) {
        size_t semi = t.find(';', pos);
        // A ';' inside a JSON string is not a separator: extend until the piece parses.
        while (true) {
          const std::string_view piece = t.substr(pos, semi == std::string_view::npos ? std::string_view::npos : semi - pos);
          ParsedToolCall c;
          if (ReadCall(Parse(TrimSpace(piece)), "parameters", c)) {
            out.calls.push_back(std::move(c));
            break;
          }
          if (semi == std::string_view::npos) {
            out.calls.clear();  // not all calls: the answer is text
            out.content = std::string(TrimSpace(text));
            return out;
          }
          semi = t.find(';', semi + 1);
        }
        if (semi == std::string_view::npos) break;
        pos = semi + 1;
        if (TrimSpace(t.substr(pos)).empty()) break;
      }
      return out;
    }
    case ToolCallFormat::kGeneric: {
      ParsedAnswer out;
      const ojson j = Parse(TrimSpace(text));
      if (j.is_object() && j.contains("tool_calls") && j["tool_calls"].is_array() && !j["tool_calls"].empty()) {
        for (const ojson& e : j["tool_calls"]) {
          ParsedToolCall c;
          if (!ReadCall(e, "arguments", c)) {
            out.calls.clear();
            out.content = std::string(TrimSpace(text));
            return out;
          }
          out.calls.push_back(std::move(c));
        }
        return out;
      }
      out.content = std::string(TrimSpace(text));
      return out;
    }
  }
  return {std::string(text), {}};
}

std::string ToolCallStream::Feed(std::string_view content) {
  if (!enabled_) return std::string(content);
  held_ += content;
  if (holding_) return {};
  const std::string_view trigger = ToolCallTrigger(format_);
  if (trigger.empty()) {
    // The call is the whole answer: decided by its first non-whitespace character.
    const size_t b = held_.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return {};
    if (held_[b] == '{' || std::string_view(held_).substr(b).starts_with("<|python_tag|>") ||
        std::string_view("<|python_tag|>").starts_with(std::string_view(held_).substr(b))) {
      // '{' or the tag (or, while short, what may become the tag): hold.
      if (held_[b] == '{' || held_.size() - b >= 14) holding_ = true;
      return {};
    }
    enabled_ = false;  // text: pass it all on
    return std::move(held_);
  }
  if (const size_t t = held_.find(trigger); t != std::string::npos) {
    std::string out = held_.substr(0, t);
    held_.erase(0, t);
    holding_ = true;
    return out;
  }
  // Keep the longest suffix that is a proper prefix of the trigger.
  size_t keep = std::min(held_.size(), trigger.size() - 1);
  while (keep > 0 && !trigger.starts_with(std::string_view(held_).substr(held_.size() - keep))) --keep;
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

void ToolCallStream::Scan(bool final) {
  // Re-lexes the held text (calls are small): containers, strings, and for each call the
  // value of its "name" key and the span of its "arguments" / "parameters" object, at the
  // depth the name key was found; keys inside arguments are the tool's, not calls.
  struct Level {
    bool object;
    bool expect_key;
  };
  std::vector<Level> stack;
  size_t call = 0;           // calls seen so far in this scan
  int call_depth = -1;       // depth of the current call's object
  int args_depth = -1;       // depth inside which the current arguments object lies
  size_t args_call = 0;
  std::string last_key;
  bool want_name = false, want_args = false;
  for (size_t i = 0; i < held_.size(); ++i) {
    const char ch = held_[i];
    if (stack.empty() && ch != '{' && ch != '[') continue;  // text outside JSON
    if (ch == '"') {
      size_t j = i + 1;
      std::string str;
      bool closed = false;
      for (; j < held_.size(); ++j) {
        if (held_[j] == '\\') {
          if (j + 1 < held_.size()) str += held_[++j];
          continue;
        }
        if (held_[j] == '"') {
          closed = true;
          break;
        }
        str += held_[j];
      }
      if (!closed) break;  // the rest is still being written
      Level& top = stack.back();
      if (top.object && top.expect_key && args_depth < 0) {
        last_key = str;
        top.expect_key = false;
        want_name = str == "name";
        want_args = str == "arguments" || str == "parameters";
      } else if (top.object && top.expect_key) {
        top.expect_key = false;
      } else if (want_name && args_depth < 0) {
        if (call >= calls_.size()) calls_.push_back({});
        if (calls_[call].name.empty()) calls_[call].name = str;
        call_depth = static_cast<int>(stack.size());
        ++call;
        want_name = false;
      }
      i = j;
      continue;
    }
    if (ch == '{' || ch == '[') {
      if (ch == '{' && want_args && args_depth < 0 && call > 0 && static_cast<int>(stack.size()) == call_depth) {
        args_depth = static_cast<int>(stack.size());
        args_call = call - 1;
        Call& c = calls_[args_call];
        if (!c.args_open) {
          c.args_open = true;
          c.args_begin = i;
        }
      }
      want_name = want_args = false;
      stack.push_back({ch == '{', ch == '{'});
      continue;
    }
    if (ch == '}' || ch == ']') {
      if (stack.empty()) break;
      stack.pop_back();
      if (args_depth >= 0 && static_cast<int>(stack.size()) == args_depth) {
        Call& c = calls_[args_call];
        c.args_end = i + 1;
        c.args_closed = true;
        args_depth = -1;
      }
      continue;
    }
    if (ch == ',' && !stack.empty() && stack.back().object) {
      stack.back().expect_key = true;
      want_name = want_args = false;
    }
  }
  // Open arguments run to the end of what is held, less a trailing partial string escape
  // or UTF-8 sequence (sent once whole).
  for (Call& c : calls_) {
    if (!c.args_open || c.args_closed) continue;
    size_t end = held_.size();
    if (!final) {
      while (end > c.args_begin && (static_cast<unsigned char>(held_[end - 1]) & 0xC0) == 0x80) --end;
      if (end > c.args_begin && (static_cast<unsigned char>(held_[end - 1]) & 0x80)) --end;  // a lead byte
    }
    c.args_end = std::max(c.args_end, end);
  }
  for (size_t k = 0; k < calls_.size(); ++k) {
    Call& c = calls_[k];
    if (c.name.empty()) continue;
    if (!c.announced) {
      pieces_.push_back({k, true, c.name, ""});
      c.announced = true;
    }
    if (c.args_open && c.args_end > c.args_begin + c.sent) {
      pieces_.push_back({k, false, "", held_.substr(c.args_begin + c.sent, c.args_end - c.args_begin - c.sent)});
      c.sent = c.args_end - c.args_begin;
    }
  }
}

bool ToolCallStream::streamed_calls_complete() const {
  return !calls_.empty() && std::all_of(calls_.begin(), calls_.end(), [](const Call& c) { return c.args_closed; });
}

std::vector<ToolCallStream::CallPiece> ToolCallStream::TakeCallPieces() {
  if (holding_ && !held_.empty()) Scan();
  return std::exchange(pieces_, {});
}

ToolCallStream::End ToolCallStream::Finish() {
  End end;
  if (held_.empty()) return end;
  if (holding_ && !calls_.empty()) {
    // Streamed: the rest of the arguments as pieces (TakeCallPieces), the text outside
    // the calls as content.
    Scan(/*final=*/true);
    ParsedAnswer a = ParseToolCalls(format_, held_);
    end.content = a.calls.empty() ? std::string() : std::move(a.content);
    held_.clear();
    holding_ = false;
    return end;
  }
  if (holding_) {
    ParsedAnswer a = ParseToolCalls(format_, held_);
    if (!a.calls.empty()) {
      end.calls = std::move(a.calls);
      end.content = std::move(a.content);
      held_.clear();
      return end;
    }
  }
  end.content = std::move(held_);
  held_.clear();
  return end;
}

}  // namespace trellis::server
