// What the Responses, Anthropic and Ollama dialects share: ordered parsing, the
// translated chat body read by the OpenAI parser with its errors renamed, and the store of
// responses kept for previous_response_id.
#include "server/api_reader.h"
#include "server/dialects.h"

namespace trellis::server {
namespace api_detail {

std::optional<ApiError> ParseOrdered(std::string_view body, const JsonShapeLimits& shape, ojson& out) {
  if (auto e = CheckJsonShape(body, shape)) return e;
  try {
    out = ojson::parse(body);
  } catch (const ojson::parse_error& e) {
    return Bad("", "the request body is not valid JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const ojson::exception&) {
    return Bad("", "the request body is not valid JSON");
  }
  if (!out.is_object()) return Bad("", "the request body must be a JSON object");
  return std::nullopt;
}

ApiError Rename(ApiError e, const Renames& renames) {
  for (const auto& [from, to] : renames) {
    if (!e.param.starts_with(from)) continue;
    const std::string old = e.param;
    e.param = to + old.substr(from.size());
    for (size_t pos = 0; (pos = e.message.find(old, pos)) != std::string::npos; pos += e.param.size()) {
      e.message.replace(pos, old.size(), e.param);
    }
    // The message may name the field without its tail ("'max_completion_tokens' must ...").
    for (size_t pos = 0; (pos = e.message.find("'" + from, pos)) != std::string::npos; pos += to.size() + 1) {
      e.message.replace(pos + 1, from.size(), to);
    }
    break;
  }
  return e;
}

Parsed<ChatCompletionRequest> ChatFromOpenAi(const ojson& body, const ApiLimits& limits, const Renames& renames) {
  auto r = ParseChatCompletionRequest(Dump(body), limits);
  if (!r.ok()) return Rename(r.error(), renames);
  return r;
}

Result<std::string> TextParts(const ojson& c, std::initializer_list<const char*> types) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return InvalidArgument("content must be a string or an array of text parts");
  std::string out;
  for (const ojson& part : c) {
    if (!part.is_object()) return InvalidArgument("content parts must be objects");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return InvalidArgument("a content part needs a string 'type'");
    if (std::none_of(types.begin(), types.end(), [&](const char* t) { return *type == t; })) {
      return InvalidArgument("content parts of type '" + Clip(type->get<std::string>()) +
                             "' are not supported (text only)");
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return InvalidArgument("a text content part needs a string 'text'");
    for (auto it = part.begin(); it != part.end(); ++it) {
      if (it.key() != "type" && it.key() != "text" && it.key() != "cache_control" && it.key() != "annotations" &&
          it.key() != "logprobs" && it.key() != "citations") {
        return InvalidArgument("unknown field '" + Clip(it.key()) + "' in a text content part");
      }
    }
    out += text->get_ref<const std::string&>();
  }
  return out;
}

}  // namespace api_detail

// ---- ResponseStore ---------------------------------------------------------------------

void ResponseStore::Drop(std::unordered_map<std::string, Slot>::iterator it) {
  bytes_ -= it->first.size() + it->second.e.conversation.size() + it->second.e.body.size();
  order_.erase(it->second.order);
  map_.erase(it);
}

void ResponseStore::Put(const std::string& id, Entry e) {
  const size_t size = id.size() + e.conversation.size() + e.body.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = map_.find(id); it != map_.end()) Drop(it);
  if (size > max_bytes_ || max_entries_ == 0) return;
  while (!order_.empty() && (map_.size() >= max_entries_ || bytes_ + size > max_bytes_)) Drop(map_.find(order_.front()));
  order_.push_back(id);
  map_.emplace(id, Slot{std::move(e), std::chrono::steady_clock::now() + ttl_, std::prev(order_.end())});
  bytes_ += size;
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id, uint64_t salt) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  if (std::chrono::steady_clock::now() > it->second.expires) {
    Drop(it);
    return std::nullopt;
  }
  if (it->second.e.salt != salt) return std::nullopt;
  return it->second.e;
}

bool ResponseStore::Erase(const std::string& id, uint64_t salt) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end() || it->second.e.salt != salt) return false;
  Drop(it);
  return true;
}

}  // namespace trellis::server
