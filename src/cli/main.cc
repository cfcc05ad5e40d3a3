// trellis: command-line entry point. Thin: parsing and dispatch only.
#include <cstdio>
#include <cstdlib>
#include <map>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "kernels/cpu_features.h"

int main(int argc, char** argv) {
  // The only place the kernel variables are read: libraries take the choice, not the
  // environment.
  trellis::ChooseKernels(trellis::KernelChoiceFromValues(std::getenv("TRELLIS_ISA"), std::getenv("TRELLIS_AVXVNNI"),
                                                         std::getenv("TRELLIS_NEON_DOTPROD"), std::getenv("TRELLIS_REPACK")));
  CLI::App app{"Trellis: private LLM inference on the CPU you own", "trellis"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("trellis 0.1.0"));
  std::map<CLI::App*, trellis::cli::Runner> runners;
  auto add = [&](const char* name, const char* help, trellis::cli::Runner (*fn)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    runners[sub] = fn(*sub);
  };
  add("run", "generate text for a prompt and print speed", trellis::cli::AddRunCommand);
  add("tokenize", "print the token ids of a text", trellis::cli::AddTokenizeCommand);
  add("gguf-info", "print a GGUF file's metadata and tensor table", trellis::cli::AddGgufInfoCommand);
  add("gen-model", "write a random-weight llama model of a named shape", trellis::cli::AddGenModelCommand);
  add("bench", "benchmarks (speed)", trellis::cli::AddBenchCommand);
  add("serve", "OpenAI-compatible HTTP server", trellis::cli::AddServeCommand);
  add("chat", "interactive chat in the terminal (the model's template, prefix cache per turn)", trellis::cli::AddChatCommand);
  add("store", "prefix tensor store server for this node", trellis::cli::AddStoreCommand);
  add("node", "grid node: hold a range of a model's layers for a `serve --grid` head", trellis::cli::AddNodeCommand);
  trellis::cli::RewriteLlamaShortFlags(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error: "trellis: <what>". Exit code is CLI11's (< 128).
    std::fprintf(stderr, "trellis: %s (see --help)\n", e.what());
    return e.get_exit_code();
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return 1;
}
