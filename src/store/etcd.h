// Store membership through etcd (Debian's etcd-server, v3 API over its JSON gateway).
//
// A store server registers "/trellis/store/members/<host:port>" under a lease it keeps
// alive (the key vanishes TTL seconds after the server stops renewing: a killed server
// leaves the membership on its own); servers and clients read the prefix to learn the
// live members. Grid nodes do the same under "/trellis/grid/nodes/", with their layer
// range as the value. Everything etcd answers is checked: a body over 4 MiB, more than
// 4096 members, an address that is not HOST:PORT or a value over 256 bytes is refused,
// never trusted.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trellis::store {

class Etcd {
 public:
  // url: "http://HOST:PORT" of an etcd member; prefix: the membership's keys.
  static Result<Etcd> Parse(const std::string& url, const std::string& prefix = kPrefix);

  // Grants a lease of ttl_s seconds and puts this member's key under it; its value is
  // `value`, or the address when empty.
  Result<int64_t> Register(const std::string& address, int ttl_s, const std::string& value = "") const;
  Status KeepAlive(int64_t lease) const;
  Status Revoke(int64_t lease) const;
  // The live members' addresses (values that are HOST:PORT), sorted.
  Result<std::vector<std::string>> Members() const;
  // Every live member: (address from the key, value), sorted; entries whose key is not
  // HOST:PORT or whose value is over 256 bytes are skipped.
  Result<std::vector<std::pair<std::string, std::string>>> Entries() const;

  static constexpr const char* kPrefix = "/trellis/store/members/";
  static constexpr const char* kGridPrefix = "/trellis/grid/nodes/";

 private:
  Result<std::string> Post(const std::string& path, const std::string& body) const;
  Result<std::vector<std::pair<std::string, std::string>>> Range() const;  // (key, value)
  std::string host_;
  int port_ = 0;
  std::string prefix_ = kPrefix;
};

// "host:port" with a non-empty host and a port in 1..65535.
bool IsHostPort(const std::string& a);

}  // namespace trellis::store
