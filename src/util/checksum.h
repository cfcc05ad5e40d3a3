// Block checksums: XXH3-64 (xxHash, Debian libxxhash-dev), at the speed of the CPU's
// widest vector unit.
//
// The store checksums every KV block it serves and checks it after every transfer, so
// hashing sits on the bulk-read path. Debian's libxxhash is built for baseline x86-64
// (SSE2) and hashes ~7 GB/s here; the same algorithm compiled for AVX2 runs ~30 GB/s. The
// value does not depend on the path: XXH3 is defined bit-exactly, and checksum_test holds
// every path to the library's answer.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trellis {

// XXH3_64bits(data, size) with seed 0, on the fastest path this CPU runs.
uint64_t Checksum64(const void* data, size_t size);

namespace checksum_detail {
uint64_t Generic(const void* data, size_t size);
uint64_t Avx2(const void* data, size_t size);  // only call when the CPU has AVX2
bool HaveAvx2();
}  // namespace checksum_detail

}  // namespace trellis
