#include "store/membership.h"

#include "util/log.h"

namespace trellis::store {

EtcdMembership::EtcdMembership(Options options, std::function<void(std::vector<std::string>)> apply)
    : o_(std::move(options)), apply_(std::move(apply)), thread_([this] { Loop(); }) {}

EtcdMembership::~EtcdMembership() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (o_.lease) (void)o_.etcd.Revoke(o_.lease);  // leave the membership at once, not after the TTL
}

void EtcdMembership::Renew() {
  Status s = o_.lease ? o_.etcd.KeepAlive(o_.lease) : NotFound("no lease");
  if (!s.ok()) {  // expired (etcd restarted, or we were cut off too long): register again
    auto l = o_.etcd.Register(o_.address, o_.ttl_s);
    if (l.ok()) o_.lease = *l;
    s = l.status();
  }
  // Said once when etcd goes away and once when it is back, not three times a second.
  if (!s.ok() && o_.reachable) TRELLIS_LOG_WARN("{}: etcd: {}; serving on, the last membership kept", o_.who, s.ToString());
  if (s.ok() && !o_.reachable) TRELLIS_LOG_INFO("{}: etcd is back; registered as {}", o_.who, o_.address);
  o_.reachable = s.ok();
}

void EtcdMembership::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, o_.period, [this] { return stop_; })) {
    lock.unlock();
    if (!o_.address.empty()) Renew();
    // An empty list too: every member is gone.
    if (auto live = o_.etcd.Members(); live.ok()) apply_(std::move(*live));
    lock.lock();
  }
}

}  // namespace trellis::store
