// trellis bench chat: multi-turn conversations against trellis serve and, optionally,
// llama.cpp's llama-server, timed the same way (see chat.cc and docs/BENCHMARKS.md).
// Shows prefix reuse to the token: each turn's request carries the whole conversation so
// far, and a server that kept the previous turn's prompt and reply computes only the new
// message. `bench agent` is the same loop for agents: the tool definitions are the shared
// prefix, and every turn is a tool call followed by its result.
//
// Thread-safety: RunChatBench is called once from main(); it starts its own conversation
// threads and child servers and joins / stops them before returning.
#pragma once

#include "util/status.h"

#include <cstdint>
#include <string>

namespace trellis::bench {

struct ChatBenchOptions {
  std::string url;           // trellis side: a running server; empty = start `trellis serve -m model`
  std::string model;         // GGUF for the servers started here
  std::string label;         // name of the trellis side in the table and CSV (default "trellis")
  std::string llama_server;  // llama-server binary; empty = trellis only
  std::string llama_template;  // Jinja chat template for llama-server (default: TinyLlama-Chat's)
  std::string serve_args;    // extra arguments for the trellis serve started here, space-separated
  std::string llama_args;    // extra arguments for llama-server, space-separated
  std::string out_dir = "results/chat";
  int turns = 8, system_tokens = 100, question_words = 20, reply_tokens = 12, conversations = 1;
  int threads = 2, warmup = 1, timeout_s = 600;
  int llama_np = 0;   // llama-server -np (0 = one slot per conversation)
  int llama_ctx = 0;  // llama-server -c (0 = 2048 per slot)
  uint64_t seed = 1;
  bool json = false;
  bool llama_ban_bytes = true;  // logit_bias banning ids 0..258, sent to both servers (random weights)
  // `bench agent`: > 0 makes every turn a forced tool call over this many tool definitions
  // (sized to about system_tokens), the next turn carrying the call and its result.
  int tools = 0;
  std::string template_file;  // Jinja template for both servers (empty: trellis's own pick, TinyLlama's for llama-server)
};

Status RunChatBench(const ChatBenchOptions& o);

}  // namespace trellis::bench
