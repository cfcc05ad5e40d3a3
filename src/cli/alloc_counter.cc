// The replacement operator new below pairs with free(); GCC cannot see that.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include "cli/alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_heap_allocations{0};

void* CountedAlloc(size_t n) {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* CountedAlignedAlloc(size_t n, std::align_val_t al) {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t a = static_cast<size_t>(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t n) { return CountedAlloc(n); }
void* operator new[](size_t n) { return CountedAlloc(n); }
void* operator new(size_t n, std::align_val_t a) { return CountedAlignedAlloc(n, a); }
void* operator new[](size_t n, std::align_val_t a) { return CountedAlignedAlloc(n, a); }
// The nothrow forms too: otherwise the library's nothrow new (std::stable_sort's buffer)
// pairs with the free()-based delete below, an allocation/deallocation mismatch.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  g_heap_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t al = static_cast<size_t>(a);
  return std::aligned_alloc(al, (n + al - 1) / al * al);
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace trellis::cli {
int64_t HeapAllocations() { return g_heap_allocations.load(std::memory_order_relaxed); }
}  // namespace trellis::cli
