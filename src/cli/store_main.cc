// trellis-store: the prefix tensor store server alone (`trellis store` as a binary of its
// own). It links the store, the HTTP layer for /metrics and util, and neither the engine
// nor the OpenAI server: a store node needs no model code.
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"trellis-store: one node's share of the prefix tensor store (docs/store.md)", "trellis-store"};
  trellis::cli::Runner run = trellis::cli::AddStoreCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "trellis-store: %s (see --help)\n", e.what());
    return e.get_exit_code();
  }
  return run();
}
