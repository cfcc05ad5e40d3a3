#include "store/etcd.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "util/base64.h"

namespace trellis::store {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxBody = 4 << 20;
constexpr size_t kMaxMembers = 4096;

std::string PrefixEnd(std::string p) {  // the first key after every key starting with p
  p.back() = static_cast<char>(p.back() + 1);
  return p;
}

}  // namespace

bool IsHostPort(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || a.size() > 255) return false;
  const std::string port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return false;
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535 && a.find_first_of(" \t\r\n/") == std::string::npos;
}

Result<Etcd> Etcd::Parse(const std::string& url, const std::string& prefix) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (!IsHostPort(rest)) return InvalidArgument("--etcd takes http://HOST:PORT, got '" + url + "'");
  Etcd e;
  const size_t colon = rest.rfind(':');
  e.host_ = rest.substr(0, colon);
  e.port_ = std::stoi(rest.substr(colon + 1));
  if (prefix.empty() || prefix.back() != '/') return InvalidArgument("an etcd prefix ends with '/'");
  e.prefix_ = prefix;
  return e;
}

Result<std::string> Etcd::Post(const std::string& path, const std::string& body) const {
  httplib::Client c(host_, port_);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(3, 0);
  c.set_write_timeout(3, 0);
  std::string got;
  bool too_big = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (got.size() + n > kMaxBody) {  // bounded before it is kept
      too_big = true;
      return false;
    }
    got.append(data, n);
    return true;
  };
  auto r = c.send(req);
  if (too_big) return Corrupt("etcd answered more than 4 MiB");
  if (!r) return Unavailable("etcd at " + host_ + ":" + std::to_string(port_) + " is not reachable");
  if (r->status != 200) return Unavailable("etcd answered HTTP " + std::to_string(r->status) + " to " + path);
  return got;
}

Result<int64_t> Etcd::Register(const std::string& address, int ttl_s, const std::string& value) const {
  if (!IsHostPort(address)) return InvalidArgument("'" + address + "' is not HOST:PORT");
  TRELLIS_ASSIGN_OR_RETURN(std::string g, Post("/v3/lease/grant", json{{"TTL", ttl_s}}.dump()));
  const json j = json::parse(g, nullptr, false);
  // etcd's gateway writes 64-bit integers as strings.
  if (!j.is_object() || !j.contains("ID")) return Corrupt("etcd lease grant: no ID");
  int64_t lease = 0;
  try {
    lease = j["ID"].is_string() ? std::stoll(j["ID"].get<std::string>()) : j["ID"].get<int64_t>();
  } catch (...) {
    return Corrupt("etcd lease grant: a malformed ID");
  }
  const json put = {{"key", Base64Encode(prefix_ + address)}, {"value", Base64Encode(value.empty() ? address : value)},
                    {"lease", std::to_string(lease)}};
  TRELLIS_RETURN_IF_ERROR(Post("/v3/kv/put", put.dump()).status());
  return lease;
}

Status Etcd::KeepAlive(int64_t lease) const {
  TRELLIS_ASSIGN_OR_RETURN(std::string r, Post("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  const json j = json::parse(r, nullptr, false);
  // A lease that expired comes back without a TTL (or TTL <= 0): register again.
  const json* res = j.is_object() && j.contains("result") ? &j["result"] : nullptr;
  if (!res || !res->is_object() || !res->contains("TTL")) return NotFound("etcd lease expired");
  return Status::Ok();
}

Status Etcd::Revoke(int64_t lease) const {
  return Post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()).status();
}

Result<std::vector<std::pair<std::string, std::string>>> Etcd::Range() const {
  const json q = {{"key", Base64Encode(prefix_)}, {"range_end", Base64Encode(PrefixEnd(prefix_))}};
  TRELLIS_ASSIGN_OR_RETURN(std::string r, Post("/v3/kv/range", q.dump()));
  const json j = json::parse(r, nullptr, false);
  if (!j.is_object()) return Corrupt("etcd range: not a JSON object");
  std::vector<std::pair<std::string, std::string>> out;
  if (!j.contains("kvs")) return out;  // no members
  const json& kvs = j["kvs"];
  if (!kvs.is_array() || kvs.size() > kMaxMembers) return Corrupt("etcd range: kvs is not a list of at most 4096");
  for (const json& kv : kvs) {
    if (!kv.is_object() || !kv.contains("value") || !kv["value"].is_string() || !kv.contains("key") ||
        !kv["key"].is_string()) {
      return Corrupt("etcd range: a malformed entry");
    }
    auto k = Base64Decode(kv["key"].get<std::string>());
    auto v = Base64Decode(kv["value"].get<std::string>());
    if (!k || !v) continue;  // garbage: skipped
    out.emplace_back(std::move(*k), std::move(*v));
  }
  return out;
}

Result<std::vector<std::string>> Etcd::Members() const {
  TRELLIS_ASSIGN_OR_RETURN(auto kvs, Range());
  std::vector<std::string> out;
  for (auto& [k, v] : kvs) {
    if (IsHostPort(v)) out.push_back(v);  // not ours, or garbage: skipped
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<std::vector<std::pair<std::string, std::string>>> Etcd::Entries() const {
  TRELLIS_ASSIGN_OR_RETURN(auto kvs, Range());
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [k, v] : kvs) {
    if (k.rfind(prefix_, 0) != 0) continue;
    std::string addr = k.substr(prefix_.size());
    if (!IsHostPort(addr) || v.size() > 256) continue;
    out.emplace_back(std::move(addr), std::move(v));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace trellis::store
