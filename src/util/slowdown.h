// Time bounds in tests, scaled to how slow this run is.
//
// A test that bounds how long something may take (an encode, a wait for a reply, a
// deadline plus its slack) holds on a native Release build; under AddressSanitizer or
// qemu-user the same work takes several times longer. TRELLIS_TEST_SLOWDOWN says how
// many times (scripts/test.sh sets it per stage: ASan + UBSan 4, qemu-user 30); without
// it, a sanitized build assumes 4 and anything else 1. Upper bounds and waits scale by
// it; lower bounds (it did wait at least this long) and the deadlines under test do not.
// The same factor is read by the end-to-end scripts (tests/server/hostile.py, lib.sh).
#pragma once

#include <chrono>
#include <cstdlib>

namespace trellis {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kTestBuildSlowdown = 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kTestBuildSlowdown = 4;
#else
inline constexpr double kTestBuildSlowdown = 1;
#endif
#else
inline constexpr double kTestBuildSlowdown = 1;
#endif

// The factor: TRELLIS_TEST_SLOWDOWN if it is a number >= 1, else the build's default.
inline double TestSlowdown() {
  static const double factor = [] {
    const char* env = std::getenv("TRELLIS_TEST_SLOWDOWN");
    if (env == nullptr) return kTestBuildSlowdown;
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    return end != env && *end == '\0' && v >= 1 && v <= 1000 ? v : kTestBuildSlowdown;
  }();
  return factor;
}

// Under an emulator (qemu-user: the factor is 10 or more), tests of logic that the native
// stages already run whole (paging and chunking grids, random property rounds, the large
// vocabulary's reference masks) run a few of their cases: the emulated stage is there for
// the other architecture's kernels and byte handling, not to repeat the same cases 30
// times slower. `scripts/test.sh --full` sets TRELLIS_TEST_FULL=1, which runs them all.
inline bool TestEmulated() {
  static const bool emulated = TestSlowdown() >= 10 && std::getenv("TRELLIS_TEST_FULL") == nullptr;
  return emulated;
}

// d times the factor.
template <class Rep, class Period>
std::chrono::milliseconds TestScaled(std::chrono::duration<Rep, Period> d) {
  return std::chrono::milliseconds(static_cast<long long>(
      std::chrono::duration<double, std::milli>(d).count() * TestSlowdown()));
}

}  // namespace trellis
