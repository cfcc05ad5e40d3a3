#include <cstdio>

#include "cli/commands.h"
#include "model/gguf.h"

namespace trellis::cli {

Runner AddGgufInfoCommand(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  app.add_option("file", *path, "GGUF file")->required();
  app.add_flag("--all-tensors", *all, "list every tensor (default: first 40)");
  return [path, all] {
    auto g = GgufFile::Open(*path);
    if (!g.ok()) return Fail(g.status().ToString());
    std::printf("file: %s\nversion: %u  alignment: %lu  data offset: %lu\n", path->c_str(), g->version(),
                static_cast<unsigned long>(g->alignment()), static_cast<unsigned long>(g->data_offset()));
    std::printf("\nmetadata (%zu keys):\n", g->metadata().size());
    for (const auto& [k, v] : g->metadata()) std::printf("  %-45s %s\n", k.c_str(), v.ToString().c_str());
    std::printf("\ntensors (%zu):\n  %-32s %-8s %-22s %12s\n", g->tensors().size(), "name", "type", "shape", "bytes");
    uint64_t total = 0;
    size_t shown = 0;
    for (const auto& t : g->tensors()) {
      total += t.size_bytes;
      if (!*all && shown >= 40) continue;
      ++shown;
      std::string shape = "[";
      for (size_t i = 0; i < t.dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.dims[i]);
      shape += "]";
      std::printf("  %-32s %-8s %-22s %12lu\n", t.name.c_str(), std::string(GetGgmlTypeTraits(t.type).name).c_str(),
                  shape.c_str(), static_cast<unsigned long>(t.size_bytes));
    }
    if (shown < g->tensors().size()) std::printf("  ... %zu more (--all-tensors)\n", g->tensors().size() - shown);
    std::printf("total tensor data: %.1f MiB\n", static_cast<double>(total) / (1 << 20));
    return 0;
  };
}

}  // namespace trellis::cli
