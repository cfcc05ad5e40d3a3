#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

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

TEST(BlockPoolTest, RejectsEmptyPool) {
  EXPECT_FALSE(BlockPool::Create(SmallLayout(), 0).ok());
}

}  // namespace
}  // namespace trellis
