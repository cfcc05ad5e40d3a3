// Helpers for engine tests: small random models written to a temp directory, and a
// rewriter that copies a GGUF with changes (to make broken or variant models).
#pragma once

#include <functional>
#include <string>

#include "engine/random_model.h"
#include "model/gguf_writer.h"

namespace trellis::testing {

// A unique path under the test temp dir.
std::string TempPath(const std::string& name);

// A 2-layer, 64-wide random model (4 heads, 2 KV heads) with the 1024-token vocab of
// the reference models; type as in RandomModelOptions.
std::string WriteSmallModel(const std::string& name, const std::string& type = "f32",
                            const std::string& vocab_path = "");

struct RewriteHooks {
  // Return false to drop the key / tensor.
  std::function<bool(const std::string& key, GgufValue& value)> metadata = nullptr;
  std::function<bool(GgufTensorInfo& info)> tensor = nullptr;
  std::function<void(GgufWriter& w)> extra = nullptr;  // add keys / tensors at the end
};

// Copies src to dst through the hooks. Tensors keep their bytes unless `tensor` changes
// the type, in which case their data is zero-filled at the new size.
void RewriteGguf(const std::string& src, const std::string& dst, const RewriteHooks& hooks);

}  // namespace trellis::testing
