// Store membership through etcd (Debian's etcd-server, v3 API over its JSON gateway).
//
// A store server registers "/trellis/store/members/<host:port>" under a lease it keeps
// alive (the key vanishes TTL seconds after the server stops renewing: a killed server
// leaves the membership on its own); servers and clients read the prefix to learn the
// live members. Everything etcd answers is checked: a body over 4 MiB, more than 4096
// members, or an address that is not HOST:PORT is refused, never trusted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace trellis::store {

class Etcd {
 public:
  // url: "http://HOST:PORT" of an etcd member.
  static Result<Etcd> Parse(const std::string& url);

  // Grants a lease of ttl_s seconds and puts this member's key under it.
  Result<int64_t> Register(const std::string& address, int ttl_s) const;
  Status KeepAlive(int64_t lease) const;
  Status Revoke(int64_t lease) const;
  // The live members' addresses, sorted.
  Result<std::vector<std::string>> Members() const;

  static constexpr const char* kPrefix = "/trellis/store/members/";

 private:
  Result<std::string> Post(const std::string& path, const std::string& body) const;
  std::string host_;
  int port_ = 0;
};

// "host:port" with a non-empty host and a port in 1..65535.
bool IsHostPort(const std::string& a);

}  // namespace trellis::store
