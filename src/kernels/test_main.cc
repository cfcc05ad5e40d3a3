// main() of the kernel and engine test binaries: the kernel variables (TRELLIS_ISA,
// TRELLIS_AVXVNNI, TRELLIS_NEON_DOTPROD, TRELLIS_REPACK) chosen from the environment as
// the `trellis` binary chooses them, so a test registered with TRELLIS_ISA=avx2 runs the
// AVX2 kernels. Libraries read no environment themselves.
#include <cstdlib>

#include <gtest/gtest.h>

#include "kernels/cpu_features.h"

int main(int argc, char** argv) {
  trellis::ChooseKernels(trellis::KernelChoiceFromValues(std::getenv("TRELLIS_ISA"), std::getenv("TRELLIS_AVXVNNI"),
                                                         std::getenv("TRELLIS_NEON_DOTPROD"), std::getenv("TRELLIS_REPACK")));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
