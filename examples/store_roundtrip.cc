// The prefix tensor store from a program of your own, on the public interface alone
// (include/trellis/store.h): store the blocks of one token sequence, find how much of a
// second sequence (sharing its start) is stored, read those blocks back and check them.
//
//   examples/store_roundtrip HOST:PORT
#include <trellis/store.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT (a trellis store server)\n", argv[0]);
    return 2;
  }
  trellis::StoreConfig config;
  config.servers = {argv[1]};
  auto store = trellis::StoreClient::Connect(config);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  trellis::BlockNamespace ns;
  ns.model_fingerprint = 0x5eed;
  ns.block_tokens = 4;
  const uint64_t block_bytes = 4096;

  // A sequence of 3 whole blocks (and a partial one, which is not stored).
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  std::vector<std::vector<unsigned char>> data(3, std::vector<unsigned char>(block_bytes));
  std::vector<const void*> blocks;
  for (size_t b = 0; b < data.size(); ++b) {
    for (size_t i = 0; i < block_bytes; ++i) data[b][i] = static_cast<unsigned char>(b * 31 + i * 7);
    blocks.push_back(data[b].data());
  }
  auto put = (*store)->Put(ns, tokens, blocks, block_bytes);
  if (!put.ok()) {
    std::fprintf(stderr, "put: %s\n", put.status().ToString().c_str());
    return 1;
  }
  std::printf("put: %zu blocks stored\n", *put);

  // Another sequence sharing the first two blocks.
  std::vector<int32_t> other = {1, 2, 3, 4, 5, 6, 7, 8, 99, 98, 97, 96};
  auto n = (*store)->Lookup(ns, other);
  if (!n.ok()) {
    std::fprintf(stderr, "lookup: %s\n", n.status().ToString().c_str());
    return 1;
  }
  std::printf("lookup: %zu blocks of the other sequence are stored\n", *n);
  std::vector<std::vector<unsigned char>> back(*n, std::vector<unsigned char>(block_bytes));
  std::vector<void*> dst;
  for (auto& b : back) dst.push_back(b.data());
  trellis::StoreReadReceipt receipt;
  if (auto s = (*store)->Get(ns, other, *n, dst, block_bytes, &receipt); !s.ok()) {
    std::fprintf(stderr, "get: %s\n", s.ToString().c_str());
    return 1;
  }
  size_t same = 0;
  for (size_t b = 0; b < *n; ++b) same += std::memcmp(back[b].data(), data[b].data(), block_bytes) == 0;
  std::printf("get: %zu of %zu blocks read back identical (%llu from the server's memory)\n", same, *n,
              static_cast<unsigned long long>(receipt.local_memory + receipt.remote));
  auto again = (*store)->Put(ns, tokens, blocks, block_bytes);
  std::printf("put again: %zu blocks stored (all were there)\n", again.ok() ? *again : size_t{999});
  return same == *n && again.ok() && *again == 0 ? 0 : 1;
}
