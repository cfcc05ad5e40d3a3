#include "grid/prefix_store.h"

#include <cstring>
#include <future>

#include "grid/head.h"

namespace trellis::grid {

Result<std::unique_ptr<GridPrefixStore>> GridPrefixStore::Connect(StoreBridgeOptions options) {
  std::unique_ptr<GridPrefixStore> s(new GridPrefixStore());
  GridPrefixStore* self = s.get();
  options.reader = [self](store::StoreClient& client, const store::LookupResult& found, size_t first, size_t from,
                          size_t to, const StoreFetch& f, net::Deadline deadline, store::GetReceipt* receipt) {
    return self->Read(client, found, first, from, to, f, deadline, receipt);
  };
  options.gather = [self](const StorePublish& p, size_t from, size_t to, uint8_t* out, net::Deadline deadline) {
    return self->Gather(p, from, to, out, deadline);
  };
  TRELLIS_ASSIGN_OR_RETURN(s->bridge_, StoreBridge::Connect(options));
  return s;
}

GridPrefixStore::~GridPrefixStore() = default;

Status GridPrefixStore::Read(store::StoreClient& client, const store::LookupResult& found, size_t first, size_t from,
                             size_t to, const StoreFetch& f, net::Deadline deadline, store::GetReceipt* receipt) {
  GridHead* h = head_.load(std::memory_order_acquire);
  if (!h) return Unavailable("the grid head is not up yet");
  if (f.epoch != h->current_epoch()) return Unavailable("a grid node lost its K/V since the fetch was planned");
  const size_t n = to - from;
  // The head's own layers (if it runs any) and every node's, read at the same time.
  std::future<Status> mine;
  store::GetReceipt mine_receipt, nodes_receipt;
  if (f.local.bytes > 0) {
    mine = std::async(std::launch::async, [&] {
      std::vector<void*> dst(f.dst.begin() + static_cast<ptrdiff_t>(from), f.dst.begin() + static_cast<ptrdiff_t>(to));
      return client.GetRange(found, first, n, dst, f.block_bytes, deadline, &mine_receipt,
                             store::ByteRange{f.local.offset, f.local.bytes});
    });
  }
  Status st = h->FetchOnNodes(found, first, std::span<const int32_t>(f.dst_blocks.data() + from, n), f.block_bytes,
                              f.slices, deadline, &nodes_receipt);
  if (mine.valid()) {
    Status m = mine.get();
    if (st.ok()) st = std::move(m);
  }
  if (st.ok() && receipt) *receipt = f.local.bytes > 0 ? mine_receipt : nodes_receipt;
  return st;
}

Status GridPrefixStore::Gather(const StorePublish& p, size_t from, size_t to, uint8_t* out, net::Deadline deadline) {
  GridHead* h = head_.load(std::memory_order_acquire);
  if (!h) return Unavailable("the grid head is not up yet");
  for (size_t i = from; p.local.bytes > 0 && i < to; ++i) {
    std::memcpy(out + (i - from) * p.block_bytes + p.local.offset, p.blocks[i], p.local.bytes);
  }
  return h->GatherFromNodes(std::span<const int32_t>(p.block_ids.data() + from, to - from), p.block_bytes, out, p.epoch,
                            deadline);
}

}  // namespace trellis::grid
