#include "util/cpus.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

TEST(Cpus, SmtSiblingsCountOnceAndUnknownTopologyCountsEach) {
  // 2 packages x 2 cores x 2 threads.
  EXPECT_EQ(CountPhysicalCores({{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 0}, {0, 1}, {1, 0}, {1, 1}}), 4);
  // An affinity mask with one thread of each of two cores.
  EXPECT_EQ(CountPhysicalCores({{0, 3}, {0, 5}}), 2);
  EXPECT_EQ(CountPhysicalCores({{-1, -1}, {-1, -1}, {0, 0}}), 3);
  EXPECT_EQ(CountPhysicalCores({}), 0);
}

TEST(Cpus, CgroupQuotasParseAndMalformedOnesAreIgnored) {
  EXPECT_DOUBLE_EQ(*ParseCpuMax("200000 100000\n"), 2.0);
  EXPECT_DOUBLE_EQ(*ParseCpuMax("150000 100000"), 1.5);
  EXPECT_FALSE(ParseCpuMax("max 100000"));
  EXPECT_FALSE(ParseCpuMax(""));
  EXPECT_FALSE(ParseCpuMax("garbage"));
  EXPECT_FALSE(ParseCpuMax("100000 0"));
  EXPECT_FALSE(ParseCpuMax("1e5 100000"));
  EXPECT_DOUBLE_EQ(*ParseCfsQuota("400000", "100000"), 4.0);
  EXPECT_FALSE(ParseCfsQuota("-1", "100000"));
  EXPECT_FALSE(ParseCfsQuota("", "100000"));
}

TEST(Cpus, ThreadsArePhysicalCoresWithinTheQuota) {
  EXPECT_EQ(ThreadsFor(8, 0), 8);
  EXPECT_EQ(ThreadsFor(8, 2.5), 2);
  EXPECT_EQ(ThreadsFor(8, 0.5), 1);
  EXPECT_EQ(ThreadsFor(2, 16), 2);
  EXPECT_EQ(ThreadsFor(0, 0), 1);
}

TEST(Cpus, ThisMachineHasABudget) {
  const CpuBudget b = ProbeCpus();
  EXPECT_GE(b.logical, 1);
  EXPECT_GE(b.physical, 1);
  EXPECT_LE(b.physical, b.logical);
  EXPECT_GE(b.threads, 1);
  EXPECT_LE(b.threads, b.physical);
  EXPECT_FALSE(b.Describe().empty());
}

}  // namespace
}  // namespace trellis
