#include "util/base64.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> kVectors[] = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, coded] : kVectors) {
    EXPECT_EQ(Base64Encode(plain), coded);
    EXPECT_EQ(Base64Decode(coded), std::optional<std::string>(plain));
  }
  const std::string bytes("\x00\xff\xfe\x80\x7f", 5);
  EXPECT_EQ(Base64Decode(Base64Encode(bytes)), bytes);
}

TEST(Base64, RefusesWhatIsNotBase64) {
  for (const char* bad : {"Zg=", "Zg", "Z===", "=Zg=", "Zg==Zg==", "Zm9v!A==", "Zm\n9v", "Zm-_"}) {
    EXPECT_EQ(Base64Decode(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(Base64Decode(std::string("Zm9\0", 4)), std::nullopt);
}

}  // namespace
}  // namespace trellis
