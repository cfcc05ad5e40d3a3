#include "util/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

namespace trellis {
namespace {

// Every path gives the library's XXH3-64 on every size class XXH3 distinguishes (0, 1-3,
// 4-8, 9-16, 17-128, 129-240, long) and on unaligned starts.
TEST(Checksum, EveryPathEqualsTheLibrary) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(3 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const size_t sizes[] = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65537, 737280, 3 << 20};
  for (size_t size : sizes) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{7}}) {
      if (off + size > buf.size()) continue;
      const uint8_t* p = buf.data() + off;
      const uint64_t want = XXH3_64bits(p, size);
      EXPECT_EQ(Checksum64(p, size), want) << size << " at +" << off;
      EXPECT_EQ(checksum_detail::Generic(p, size), want) << size;
      if (checksum_detail::HaveAvx2()) {
        EXPECT_EQ(checksum_detail::Avx2(p, size), want) << size << " at +" << off;
      }
    }
  }
}

TEST(Checksum, OneFlippedBitChangesIt) {
  std::vector<uint8_t> buf(737280, 0x5a);
  const uint64_t a = Checksum64(buf.data(), buf.size());
  buf[buf.size() / 2] ^= 0x10;
  EXPECT_NE(Checksum64(buf.data(), buf.size()), a);
}

}  // namespace
}  // namespace trellis
