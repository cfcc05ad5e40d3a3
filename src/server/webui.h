// The web page `trellis serve` answers at / (src/server/webui/index.html, docs/server.md
// "The web page"): its files, embedded in the binary at build time (webui/embed.cmake:
// index.html and Debian's libjs-marked), or read from a folder given with --webui-path.
//
// Thread safety: EmbeddedWebAsset returns views of static data; ReadWebAsset reads a file.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace trellis::server {

struct WebAsset {
  std::string_view body;
  const char* content_type;
};

// "index.html" or "marked.min.js"; nullopt for any other name.
std::optional<WebAsset> EmbeddedWebAsset(std::string_view name);

// Whether `name` may name a file of the page: 1-128 of [A-Za-z0-9._-], not starting with
// a dot (no path, no parent, no hidden file).
bool ValidWebAssetName(std::string_view name);
// The Content-Type for a file name's extension (html, js, css, svg, png, json; else
// application/octet-stream).
const char* WebAssetType(std::string_view name);
// dir/name, at most max_bytes: NotFound if absent, an error if larger or unreadable.
Result<std::string> ReadWebAsset(const std::string& dir, std::string_view name, size_t max_bytes = 16u << 20);

}  // namespace trellis::server
