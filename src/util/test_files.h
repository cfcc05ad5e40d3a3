// Reading test data, for the unit tests (header-only; nothing outside tests includes it).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace trellis::testing {

// The whole file as bytes; "" when it cannot be opened (the test's checks then fail).
inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#ifdef TRELLIS_TEST_DATA
// A file under tests/data (TRELLIS_TEST_DATA, which the test targets define), by its
// relative path; "" when it cannot be opened.
inline std::string ReadTestData(const std::string& relative) {
  return ReadFileBytes(std::string(TRELLIS_TEST_DATA) + "/" + relative);
}
#endif

}  // namespace trellis::testing
