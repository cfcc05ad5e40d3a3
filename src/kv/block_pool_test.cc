#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

namespace trellis {
namespace {

KvLayout SmallLayout() { return KvLayout{2, 2, 32, 8}; }

TEST(BlockPoolTest, AllocateUntilExhaustedThenReuse) {
  auto pool = BlockPool::Create(SmallLayout(), 4);
  ASSERT_TRUE(pool.ok());
  BlockPool& p = **pool;
  std::set<int32_t> ids;
  for (int i = 0; i < 4; ++i) {
    int32_t id = p.Allocate();
    ASSERT_NE(id, BlockPool::kNoBlock);
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(p.Allocate(), BlockPool::kNoBlock);
  EXPECT_EQ(p.n_free(), 0);
  p.Release(*ids.begin());
  EXPECT_EQ(p.n_free(), 1);
  EXPECT_EQ(p.Allocate(), *ids.begin());
}

TEST(BlockPoolTest, AcquireKeepsBlockAliveUntilLastRelease) {
  auto pool = BlockPool::Create(SmallLayout(), 2);
  ASSERT_TRUE(pool.ok());
  BlockPool& p = **pool;
  int32_t a = p.Allocate();
  p.Acquire(a);
  EXPECT_EQ(p.refcount(a), 2);
  p.Release(a);
  EXPECT_EQ(p.n_free(), 1);
  p.Release(a);
  EXPECT_EQ(p.n_free(), 2);
}

TEST(BlockPoolTest, BlocksAreDisjointAndAligned) {
  auto pool = BlockPool::Create(SmallLayout(), 3);
  ASSERT_TRUE(pool.ok());
  BlockPool& p = **pool;
  EXPECT_EQ(p.block_bytes(), SmallLayout().BlockBytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.BlockData(0)) % 64, 0u);
  EXPECT_EQ(p.BlockData(1) - p.BlockData(0), static_cast<std::ptrdiff_t>(p.block_bytes()));
}

// Copy-on-write of a block's first slots copies those rows of every (layer, K/V, head)
// and nothing else, in every K/V type (rows of 64, 34 x 2 and 18 x 2 bytes here).
TEST(BlockPoolTest, CopySlotsCopiesTheFirstRowsOfEveryTile) {
  for (auto [kt, vt] : {std::pair{KvType::kF16, KvType::kF16}, {KvType::kQ8_0, KvType::kQ4_0}, {KvType::kQ4_0, KvType::kQ8_0}}) {
    SCOPED_TRACE(std::string(KvTypeName(kt)) + "/" + KvTypeName(vt));
    const KvLayout L{2, 2, 64, 8, kt, vt};
    auto pool = BlockPool::Create(L, 2);
    ASSERT_TRUE(pool.ok());
    BlockPool& p = **pool;
    const int32_t a = p.Allocate(), b = p.Allocate();
    for (size_t i = 0; i < p.block_bytes(); ++i) {
      p.BlockData(a)[i] = static_cast<uint8_t>(i * 7 + 1);
      p.BlockData(b)[i] = 0xEE;
    }
    p.CopySlots(a, b, 3);
    for (int l = 0; l < 2; ++l) {
      for (int c = 0; c < 2; ++c) {
        for (int h = 0; h < 2; ++h) {
          for (int s = 0; s < 8; ++s) {
            const size_t off = L.ByteOffset(l, c, h, s);
            for (size_t k = 0; k < L.RowBytes(c); ++k) {
              ASSERT_EQ(p.BlockData(b)[off + k], s < 3 ? p.BlockData(a)[off + k] : 0xEE)
                  << "layer " << l << " kv " << c << " head " << h << " slot " << s;
            }
          }
        }
      }
    }
  }
}

TEST(BlockPoolTest, RejectsEmptyPool) {
  EXPECT_FALSE(BlockPool::Create(SmallLayout(), 0).ok());
}

}  // namespace
}  // namespace trellis
