#include "cli/kv_flags.h"

#include <cstring>
#include <vector>

namespace trellis::cli {

KvType KvTypeFlags::K() const {
  KvType t = KvType::kF16;
  ParseKvType(k, &t);  // checked by the flag's validator
  return t;
}

KvType KvTypeFlags::V() const {
  KvType t = KvType::kF16;
  ParseKvType(v, &t);
  return t;
}

void AddKvTypeFlags(CLI::App& app, KvTypeFlags* f, bool node) {
  const std::vector<std::string> names = {"f16", "q8_0", "q4_0"};
  if (node) {
    f->k.clear();
    f->v.clear();
    app.add_option("--cache-type-k", f->k, "accept only heads keeping K as this type (f16, q8_0, q4_0; default: the head's); also -ctk")
        ->check(CLI::IsMember(names));
    app.add_option("--cache-type-v", f->v, "accept only heads keeping V as this type; also -ctv")->check(CLI::IsMember(names));
    return;
  }
  app.add_option("--cache-type-k", f->k, "K cache type: f16, q8_0 (~1.9x the tokens per byte), q4_0 (~3.6x); also -ctk")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--cache-type-v", f->v, "V cache type: f16, q8_0, q4_0; also -ctv")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
}

void RewriteLlamaShortFlags(int argc, char** argv) {
  static char k[] = "--cache-type-k", v[] = "--cache-type-v";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;
    if (std::strcmp(argv[i], "-ctk") == 0) argv[i] = k;
    else if (std::strcmp(argv[i], "-ctv") == 0) argv[i] = v;
  }
}

}  // namespace trellis::cli
