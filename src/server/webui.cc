#include "server/webui.h"

#include "util/env.h"

namespace trellis::server {

bool ValidWebAssetName(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

const char* WebAssetType(std::string_view name) {
  const size_t dot = name.rfind('.');
  const std::string_view ext = dot == std::string_view::npos ? "" : name.substr(dot + 1);
  if (ext == "html") return "text/html; charset=utf-8";
  if (ext == "js" || ext == "mjs") return "text/javascript; charset=utf-8";
  if (ext == "css") return "text/css; charset=utf-8";
  if (ext == "svg") return "image/svg+xml";
  if (ext == "png") return "image/png";
  if (ext == "json") return "application/json";
  return "application/octet-stream";
}

Result<std::string> ReadWebAsset(const std::string& dir, std::string_view name, size_t max_bytes) {
  if (!ValidWebAssetName(name)) return NotFound("no such file");
  Env* env = Env::Default();
  auto f = env->Open(dir + "/" + std::string(name), OpenMode::kRead);
  if (!f.ok()) return NotFound("no such file");
  auto size = (*f)->Size();
  if (!size.ok()) return size.status();
  if (*size > max_bytes) return InvalidArgument("the file is larger than " + std::to_string(max_bytes) + " bytes");
  std::string out(static_cast<size_t>(*size), '\0');
  TRELLIS_RETURN_IF_ERROR((*f)->ReadAt(0, out.data(), out.size()));
  return out;
}

}  // namespace trellis::server
