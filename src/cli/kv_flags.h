// The K/V cache type flags of run, serve, chat, node and bench (docs/kv_layout.md).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "kernels/attention.h"

namespace trellis::cli {

// The K/V cache types (docs/kv_layout.md): --cache-type-k / --cache-type-v, each f16,
// q8_0 or q4_0, spelled -ctk / -ctv as in llama.cpp too (RewriteLlamaShortFlags).
struct KvTypeFlags {
  std::string k = "f16", v = "f16";
  KvType K() const;
  KvType V() const;
};
// `node`: a grid node keeps the types its head asks for; given, they are the only ones
// it accepts (flags empty by default).
void AddKvTypeFlags(CLI::App& app, KvTypeFlags* f, bool node = false);
// CLI11 takes one-letter short options only: llama.cpp's -ctk / -ctv become the long
// names in argv before parsing.
void RewriteLlamaShortFlags(int argc, char** argv);

}  // namespace trellis::cli
