// EtcdMembership: a store member's view of the membership, kept from etcd on a thread of
// its own (docs/store.md, "Placement and membership"). Every period it reads the members
// registered and hands the list to `apply` (which takes it to its owner's loop thread);
// for a server it also keeps `address` registered under a lease of ttl_s seconds, renewed
// each period and registered again when it has expired (etcd restarted, or the server was
// cut off longer than the lease). etcd down keeps the last membership; that is said once
// when it goes and once when it is back, not every period. The store server registers
// and reads; a client only reads.
//
// Thread safety: the constructor starts the thread; the destructor stops it and, for a
// server, revokes the lease so the server leaves the membership at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "store/etcd.h"

namespace trellis::store {

class EtcdMembership {
 public:
  struct Options {
    explicit Options(Etcd e) : etcd(std::move(e)) {}
    Etcd etcd;
    std::chrono::milliseconds period{1000};
    // A server's: the address to keep registered ("" for a client), its lease's TTL, the
    // lease registered at start (0: none yet) and whether etcd answered then.
    std::string address;
    int ttl_s = 5;
    int64_t lease = 0;
    bool reachable = true;
    std::string who = "store";  // names the owner in the log
  };

  EtcdMembership(Options options, std::function<void(std::vector<std::string>)> apply);
  ~EtcdMembership();
  EtcdMembership(const EtcdMembership&) = delete;
  EtcdMembership& operator=(const EtcdMembership&) = delete;

 private:
  void Loop();
  void Renew();  // a server's: keep the registration

  Options o_;
  std::function<void(std::vector<std::string>)> apply_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace trellis::store
