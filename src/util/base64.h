// Base64 (RFC 4648, the standard alphabet, padded): etcd's v3 JSON API carries keys and
// values in it; the server's Responses dialect carries reasoning in it (encrypted_content).
// No Debian-packaged C++ library offers it outside a detail namespace (Boost.Beast's) or a
// crypto library we do not otherwise link (OpenSSL), so it lives here.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace trellis {

std::string Base64Encode(std::string_view in);
// nullopt on anything that is not padded standard base64 (a length not a multiple of 4,
// a byte outside the alphabet, padding anywhere but the last two places).
std::optional<std::string> Base64Decode(std::string_view in);

}  // namespace trellis
