// The public StoreClient (include/trellis/store.h) over store::StoreClient.
#include "trellis/store.h"

#include <chrono>

#include "store/client.h"

namespace trellis {

struct StoreClient::Impl {
  std::unique_ptr<store::StoreClient> client;
  std::chrono::milliseconds timeout{2000};
  net::Deadline Deadline() const { return net::After(timeout); }
};

namespace {

store::Namespace ToInternal(const BlockNamespace& ns) {
  return store::Namespace{ns.model_fingerprint, ns.block_tokens, ns.kv_dtype, ns.layout_version, ns.salt};
}

}  // namespace

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Result<std::unique_ptr<StoreClient>> StoreClient::Connect(const StoreConfig& c) {
  if (c.timeout_ms < 1 || c.timeout_ms > 600000) return InvalidArgument("timeout_ms must be in 1..600000");
  store::ClientOptions o;
  o.servers = c.servers;
  o.local = c.local;
  o.etcd = c.etcd;
  auto impl = std::make_unique<Impl>();
  impl->timeout = std::chrono::milliseconds(c.timeout_ms);
  TRELLIS_ASSIGN_OR_RETURN(impl->client, store::StoreClient::Connect(o, impl->Deadline()));
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

Result<size_t> StoreClient::Lookup(const BlockNamespace& ns, std::span<const int32_t> tokens) {
  TRELLIS_ASSIGN_OR_RETURN(store::LookupResult found, impl_->client->Lookup(ToInternal(ns), tokens, impl_->Deadline()));
  return found.blocks;
}

Status StoreClient::Get(const BlockNamespace& ns, std::span<const int32_t> tokens, size_t n_blocks,
                        std::span<void* const> dst, uint64_t block_bytes, StoreReadReceipt* receipt) {
  const net::Deadline d = impl_->Deadline();
  TRELLIS_ASSIGN_OR_RETURN(store::LookupResult found, impl_->client->Lookup(ToInternal(ns), tokens, d));
  if (found.blocks < n_blocks) {
    return NotFound(std::to_string(n_blocks) + " blocks asked for, " + std::to_string(found.blocks) + " stored");
  }
  if (dst.size() < n_blocks) return InvalidArgument("fewer buffers than blocks");
  store::GetReceipt g;
  TRELLIS_RETURN_IF_ERROR(impl_->client->Get(found, n_blocks, dst, block_bytes, d, &g));
  if (receipt) *receipt = StoreReadReceipt{g.memory, g.replica, g.ssd, g.remote};
  return Status::Ok();
}

Result<size_t> StoreClient::Put(const BlockNamespace& ns, std::span<const int32_t> tokens,
                                std::span<const void* const> blocks, uint64_t block_bytes) {
  return impl_->client->Put(ToInternal(ns), tokens, blocks, block_bytes, /*cost_s=*/1.0, impl_->Deadline());
}

std::vector<std::string> StoreClient::Members() const { return impl_->client->Members(); }

}  // namespace trellis
