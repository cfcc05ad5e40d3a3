// MemEnv: files in memory behave as the POSIX Env's do (what the store's SSD tier and the
// GGUF writer rely on), and a FaultEnv over it injects its faults as over a disk.
#include "util/mem_env.h"

#include <gtest/gtest.h>

#include "util/fault_env.h"

namespace trellis {
namespace {

TEST(MemEnvTest, FilesBehaveAsOnDisk) {
  MemEnv env;
  EXPECT_EQ(env.Open("d/a", OpenMode::kTruncate).status().code(), StatusCode::kIoError);  // no directory
  ASSERT_TRUE(env.CreateDir("d").ok());
  auto f = env.Open("d/a", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->WriteAt(4, "xyz", 3).ok());  // a hole reads as zeros
  EXPECT_EQ(*(*f)->Size(), 7u);
  char buf[7];
  ASSERT_TRUE((*f)->ReadAt(0, buf, 7).ok());
  EXPECT_EQ(std::string(buf, 7), std::string("\0\0\0\0xyz", 7));
  EXPECT_EQ((*f)->ReadAt(5, buf, 3).code(), StatusCode::kIoError);  // short read
  auto r = env.Open("d/a", OpenMode::kRead);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->WriteAt(0, "q", 1).code(), StatusCode::kIoError);  // read only
  EXPECT_EQ(env.Open("d/none", OpenMode::kRead).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(env.Rename("d/a", "d/b").ok());
  EXPECT_EQ(*env.ListDir("d"), std::vector<std::string>{"b"});
  ASSERT_TRUE((*r)->ReadAt(4, buf, 3).ok());  // an open file outlives its name
  EXPECT_EQ(std::string(buf, 3), "xyz");
  auto m = env.MapReadOnly("d/b");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 7u);
  EXPECT_EQ(m->data()[6], 'z');
  ASSERT_TRUE(env.Remove("d/b").ok());
  EXPECT_TRUE(env.ListDir("d")->empty());
  EXPECT_EQ(m->data()[4], 'x');  // the map keeps its bytes
  EXPECT_EQ(env.MapReadOnly("d/b").status().code(), StatusCode::kNotFound);
}

TEST(MemEnvTest, AFaultEnvOverItLosesUnsyncedDataAsOverADisk) {
  MemEnv mem;
  FaultEnv env(&mem);
  ASSERT_TRUE(env.CreateDir("d").ok());
  auto f = env.Open("d/log", OpenMode::kTruncate);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->WriteAt(0, "synced", 6).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->WriteAt(6, "-lost", 5).ok());
  env.LoseUnsyncedData();
  EXPECT_EQ(*mem.Contents("d/log"), "synced");
  env.fail_writes = true;
  EXPECT_FALSE((*f)->WriteAt(0, "x", 1).ok());
  EXPECT_GT(env.injected.load(), 0u);
}

}  // namespace
}  // namespace trellis
