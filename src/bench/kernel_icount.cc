// kernel_icount: one MatMul of a 256 x 2048 weight matrix, packed (x16, packed.h) or in the
// file's row-major layout, repeated `reps` times, on the widest kernel path of this CPU.
// bench/neon_icount.py runs it under qemu-user on x86-64 hosts to count the instructions a
// MatMul executes on the NEON paths (reps 2 minus reps 1), which is the one figure of the
// aarch64 kernels this project can measure without ARM hardware. The weights are random
// bytes: values do not change which instructions run.
//
// usage: kernel_icount TYPE PACKED N_TOKENS REPS   (TYPE as ggml names it: q4_0, q4_K, ...)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/packed.h"
#include "util/thread_pool.h"

int main(int argc, char** argv) {
  using namespace trellis;
  if (argc != 5) {
    std::fprintf(stderr, "usage: kernel_icount TYPE PACKED N_TOKENS REPS\n");
    return 2;
  }
  const std::string_view name = argv[1];
  const bool packed = std::atoi(argv[2]) != 0;
  const int64_t n_tokens = std::atoi(argv[3]), reps = std::atoi(argv[4]);
  uint32_t id = 0;
  while (id < 64 && GetGgmlTypeTraits(id).name != name) ++id;
  if (id == 64 || !GetGgmlTypeTraits(id).computable || n_tokens < 1 || reps < 0) {
    std::fprintf(stderr, "kernel_icount: bad type '%s' or counts\n", argv[1]);
    return 2;
  }
  const GgmlType type = static_cast<GgmlType>(id);
  const int64_t rows = 256, cols = 2048, row_bytes = RowBytes(type, cols);
  std::mt19937 rng(1);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() & 0x3B);  // f16 scales stay finite
  WeightMatrix w{type, bytes.data(), rows, cols, row_bytes};
  std::vector<uint8_t> packed_copy;
  if (packed) {
    if (!PackingUseful(w)) {
      std::fprintf(stderr, "kernel_icount: no packed kernel for %s on %s\n", argv[1], KernelPathName());
      return 2;
    }
    packed_copy.resize(PackedBytes(w) + 64);
    uint8_t* p = packed_copy.data() + (64 - reinterpret_cast<uintptr_t>(packed_copy.data()) % 64) % 64;
    PackWeights(w, 0, (rows + kPackRows - 1) / kPackRows, p);
    w.packed = p;
  }
  std::vector<float> x(static_cast<size_t>(n_tokens * cols)), y(static_cast<size_t>(n_tokens * rows));
  std::normal_distribution<float> dist;
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> scratch(MatMulScratchBytes(type, cols, n_tokens) + 64);
  void* s = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  ThreadPool pool(1);
  for (int64_t i = 0; i < reps; ++i) {
    matmul_internal::MatMulWithIsa(BestKernelIsa(), w, x.data(), cols, n_tokens, y.data(), rows, pool, s);
  }
  double sum = 0;
  for (float v : y) sum += v;
  std::printf("%s packed=%d tokens=%lld path=%s checksum=%g\n", argv[1], packed ? 1 : 0,
              static_cast<long long>(n_tokens), KernelPathName(), sum);
  return 0;
}
