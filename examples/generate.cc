// An agent-style program on the public interface alone (include/trellis/engine.h): two
// threads ask one engine questions behind the same long instructions at the same time;
// the engine decodes them together, and the second prompt finds the instructions in the
// prefix cache. Prints each answer with where its prompt's tokens came from.
//
//   examples/generate MODEL.gguf [QUESTION ...]
#include <trellis/engine.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [QUESTION ...]\n", argv[0]);
    return 2;
  }
  trellis::EngineConfig config;
  config.model_path = argv[1];
  auto engine = trellis::Engine::Open(config);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().ToString().c_str());
    return 1;
  }
  const trellis::ModelInfo info = (*engine)->info();
  std::printf("model: %s, %d layers, context %d, kernels %s\n", info.architecture.c_str(), info.n_layer, info.ctx_size,
              info.kernels.c_str());

  std::string instructions = "You are a careful assistant. Answer in one short sentence. ";
  for (int i = 0; i < 8; ++i) instructions += "Think about the question before you answer it. ";
  std::vector<std::string> questions;
  for (int i = 2; i < argc; ++i) questions.push_back(argv[i]);
  if (questions.empty()) questions = {"What is a prefix cache?", "Why batch decoding?"};

  trellis::GenerateOptions options;
  options.max_tokens = 16;
  // The first question alone, to fill the cache; then the rest at once, on threads.
  std::vector<trellis::Result<trellis::Completion>> answers(questions.size(), trellis::Status::Ok());
  answers[0] = (*engine)->Generate(instructions + questions[0], options);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < questions.size(); ++i) {
    threads.emplace_back([&, i] { answers[i] = (*engine)->Generate(instructions + questions[i], options); });
  }
  for (std::thread& t : threads) t.join();

  int failed = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    if (!answers[i].ok()) {
      std::printf("question %zu: error: %s\n", i, answers[i].status().ToString().c_str());
      ++failed;
      continue;
    }
    const trellis::Completion& c = *answers[i];
    std::printf("question %zu: %zu tokens (%s); prompt %d tokens: %d cached, %d from the store, %d computed\n", i,
                c.tokens.size(), c.finish_reason.c_str(), c.receipt.prompt_tokens, c.receipt.cached, c.receipt.store,
                c.receipt.computed);
    std::printf("ids:");
    for (int32_t t : c.tokens) std::printf(" %d", t);
    std::printf("\n");
  }

  // Streaming: pieces of text as they are made; returning false stops the generation.
  int pieces = 0;
  auto streamed = (*engine)->Generate(instructions + questions[0], options, [&](std::string_view piece, int32_t) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    return ++pieces < 4;
  });
  std::printf("\nstreamed: %s after %d pieces\n", streamed.ok() ? streamed->finish_reason.c_str() : "error", pieces);
  return failed == 0 && streamed.ok() ? 0 : 1;
}
