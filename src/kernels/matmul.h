// Matrix-vector / matrix-matrix products of GGUF weight matrices with f32 activations.
//
// y[t][r] = sum_c W[r][c] * x[t][c]. Activations are first converted the way llama.cpp's
// CPU backend does it (Q8_0 for Q4_0/Q8_0 weights, Q8_K for Q4_K/Q6_K, f16 for F16,
// bf16 for BF16, f32 kept for F32) into caller-provided scratch, then every weight row is
// dotted with them using integer dots per block. The kernel family (scalar, AVX2,
// AVX-512 VNNI/BF16) is chosen at run time with BestKernelIsa().
//
// Thread safety: MatMul uses every thread of the pool it is given and must not run twice
// at once on the same pool or scratch. MatMulRef and GetRow are pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/ggml_type.h"
#include "util/thread_pool.h"

namespace trellis {

// A weight matrix as stored in GGUF: `rows` rows of `cols` elements, row r at
// data + r * row_bytes (row_bytes = RowBytes(type, cols)). Borrowed (mmapped file).
struct WeightMatrix {
  GgmlType type;
  const void* data;
  int64_t rows;
  int64_t cols;
  int64_t row_bytes;
  // Optional copy in the x16 layout of packed.h (borrowed, owned by whoever packed it).
  // MatMul uses it where the CPU has the packed kernels, and `data` elsewhere.
  const uint8_t* packed = nullptr;
};

// While set on a thread, every MatMul / MatMulShared that thread calls adds the wall time
// of its activation conversion (step 1 of the product) to *ns; nullptr turns it off. For
// profiles (ForwardProfile); costs two clock reads per product while set.
void SetActivationTimer(int64_t* ns);

// Bytes of scratch MatMul needs for n_tokens activation rows of `cols` against `type`.
// Pure function: callers size once at start-up (0 for F32 weights).
size_t MatMulScratchBytes(GgmlType type, int64_t cols, int64_t n_tokens);

// y[t*y_stride + r] = sum_c W[r][c] * x[t*x_stride + c], for t < n_tokens, r < rows.
// REQUIRES: w.type computable, cols a multiple of the block size, scratch 64-byte aligned
// and >= MatMulScratchBytes(w.type, w.cols, n_tokens) bytes; y does not alias x.
// Runs on all threads of `pool` (the caller is thread 0); performs no heap allocation.
void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
            int64_t y_stride, ThreadPool& pool, void* scratch);

// One product of MatMulShared: y[t * y_stride + r] = sum_c w[r][c] * x[t][c].
struct MatMulOut {
  const WeightMatrix* w;
  float* y;
  int64_t y_stride;
};

// Several matrices applied to the same x (q/k/v, gate/up): the same results as one MatMul
// per output, but where all are packed alike (packed.h) x is converted once and all their
// tiles run in one parallel pass: one barrier instead of two per matrix.
// REQUIRES: as MatMul for each output; scratch sized for the largest.
void MatMulShared(std::span<const MatMulOut> outs, const float* x, int64_t x_stride, int64_t n_tokens,
                  ThreadPool& pool, void* scratch);

// Same math, single-threaded scalar reference: quantizes activations the same way and
// uses an integer dot per block. Allocates; for tests and tools only.
void MatMulRef(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
               int64_t y_stride);

// Dequantizes row r of w into dst[cols] (embedding lookup). REQUIRES: 0 <= r < rows.
void GetRow(const WeightMatrix& w, int64_t r, float* dst);

}  // namespace trellis
