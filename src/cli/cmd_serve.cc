// trellis serve: the OpenAI-compatible HTTP server (src/server/, docs/server.md).
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "cli/grid_flags.h"
#include "cli/store_flags.h"
#include "grid/prefix_store.h"
#include "cli/template_flags.h"
#include "engine/engine_loop.h"
#include "engine/model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "server/server.h"

namespace trellis::cli {
namespace {

struct ServeOpts {
  std::string model, host = "127.0.0.1", chat_template, alias, webui_path;
  bool no_webui = false;
  int port = 8080;
  int threads = 0;  // 0: the physical cores this process may use
  int ctx = 0;
  int block_size = 32;
  int64_t kv_memory = 0;
  KvTypeFlags kv_types;
  int64_t kv_blocks = 0;
  int max_queue = 256;
  int max_running = 16;
  int batch = 512;
  int http_threads = 0;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string metrics_key;
  bool share_cache = false;
  bool no_prefix_cache = false;
  // HTTP limits (docs/server.md, "Limits")
  int64_t max_body = 8 << 20;
  int64_t max_decoded_body = 0;  // 0: --max-body
  int64_t max_prompt_bytes = 0;  // 0: ctx x the longest token piece
  int max_connections = 1024;
  double header_timeout = 10, body_timeout = 30, idle_timeout = 5, write_timeout = 30;
  double shutdown_timeout = 10;
  std::string log_format = "text";
  std::string reasoning_format = "deepseek";
  StoreFlags store;
  GridFlags grid;
};

std::string CheckOpts(const ServeOpts& o) {
  if (o.port < 0 || o.port > 65535) return "--port must be in 0..65535 (0 = any free port)";
  if (o.threads < 0 || o.threads > 1024) return "--threads must be in 1..1024 (0 = the physical cores available)";
  if (o.ctx < 0) return "--ctx-size must be >= 0 (0 = the model's, capped at 4096)";
  if (o.kv_blocks < 0) return "--kv-blocks must be >= 0 (0 = from --kv-memory)";
  if (o.kv_memory < 0) return "--kv-memory must be >= 0 (0 = four full contexts)";
  if (o.max_queue < 1) return "--max-queue must be >= 1";
  if (o.max_running < 1) return "--max-running must be >= 1";
  if (o.http_threads < 0) return "--http-threads must be >= 0";
  if (o.max_body < 1) return "--max-body must be >= 1 byte";
  if (o.max_decoded_body < 0) return "--max-decoded-body must be >= 0 (0 = --max-body)";
  if (o.max_prompt_bytes < 0) return "--max-prompt-bytes must be >= 0 (0 = derived from the context)";
  if (o.max_connections < 2) return "--max-connections must be >= 2";
  for (double t : {o.header_timeout, o.body_timeout, o.idle_timeout, o.write_timeout}) {
    if (!(t > 0 && t <= 86400)) return "timeouts must be in (0, 86400] seconds";
  }
  if (!(o.shutdown_timeout >= 0 && o.shutdown_timeout <= 86400)) return "--shutdown-timeout must be in [0, 86400]";
  if (o.log_format != "text" && o.log_format != "json") return "--log-format must be text or json";
  if (o.reasoning_format != "deepseek" && o.reasoning_format != "none") return "--reasoning-format must be deepseek or none";
  for (const std::string& k : o.api_keys) {
    if (k.empty()) return "--api-key must not be empty";
  }
  return {};
}

int Serve(const ServeOpts& opts) {
  ServeOpts o = opts;
  if (std::string bad = CheckOpts(o); !bad.empty()) return Fail(bad);
  if (!o.api_key_file.empty()) {
    std::FILE* f = std::fopen(o.api_key_file.c_str(), "r");
    if (!f) return Fail("cannot read --api-key-file " + o.api_key_file);
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      std::string k(line);
      while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
      if (!k.empty() && k[0] != '#') o.api_keys.push_back(k);
    }
    std::fclose(f);
    if (o.api_keys.empty()) return Fail("--api-key-file " + o.api_key_file + " holds no key");
  }
  if (Status d = DiscoverGrid(o.grid, o.model); !d.ok()) return Fail(d.message());
  auto part = HeadPart(o.grid);
  if (!part.ok()) return Fail(part.status().message());
  auto model = Model::Load(o.model, *part);
  if (!model.ok()) return Fail(model.status().ToString());
  auto tok = Tokenizer::FromGguf((*model)->gguf());
  if (!tok.ok()) return Fail(tok.status().ToString());
  std::string template_source;
  auto chat = PickTemplate(o.chat_template, **model, **tok, template_source);
  if (!chat.ok()) return Fail(chat.status().message());

  // Signals are taken by one waiting thread: block them before any thread starts so every
  // thread inherits the mask. A closed client socket must not kill the process.
  sigset_t sigs = BlockStopSignals();

  // The store first: the engine borrows it, so it must outlive the engine. With a grid,
  // the grid's prefix store: the head's layers are read here and every node reads its
  // own (the head is attached to it once the scheduler has made it).
  grid::GridHead* grid_head = nullptr;
  std::unique_ptr<grid::GridPrefixStore> grid_store;
  Result<std::unique_ptr<StoreBridge>> store = std::unique_ptr<StoreBridge>();
  if (!o.grid.grid.empty() && !o.store.store.empty()) {
    auto bo = BridgeOptions(o.store);
    if (!bo.ok()) return Fail(bo.status().ToString());
    auto g = grid::GridPrefixStore::Connect(**bo);
    if (!g.ok()) return Fail("--store " + o.store.store + ": " + g.status().ToString());
    grid_store = std::move(*g);
  } else {
    store = ConnectStore(o.store);
    if (!store.ok()) return Fail(store.status().ToString());
  }
  StoreBridge* bridge = grid_store ? &grid_store->bridge() : store->get();
  std::string threads_how;
  o.threads = ResolveThreads(o.threads, &threads_how);
  ThreadPool pool(o.threads);
  SchedulerOptions so;
  so.store = grid_store ? static_cast<PrefixStore*>(grid_store.get()) : store->get();
  so.prefix_cache = !o.no_prefix_cache;
  so.block_size = o.block_size;
  so.kv_type_k = o.kv_types.K();
  so.kv_type_v = o.kv_types.V();
  so.kv_memory_bytes = o.kv_memory;
  so.kv_blocks = o.kv_blocks;
  so.n_ctx = o.ctx;
  so.max_running = o.max_running;
  so.max_batch_tokens = o.batch;
  so.prefill_chunk = o.batch;
  if (Status g = ConfigureGrid(o.grid, **model, so, &grid_head, grid_store.get()); !g.ok()) return Fail(g.message());
  auto engine = EngineLoop::Start(**model, so, pool, static_cast<size_t>(o.max_queue));
  if (!engine.ok()) return Fail(engine.status().ToString());

  server::ServerOptions sopt;
  sopt.host = o.host;
  sopt.port = o.port;
  sopt.model_id = !o.alias.empty() ? o.alias : std::filesystem::path(o.model).stem().string();
  sopt.model_path = o.model;
  sopt.webui = !o.no_webui;
  sopt.webui_path = o.webui_path;
  std::error_code size_error;
  sopt.model_bytes = std::filesystem::file_size(o.model, size_error);
  if (size_error) sopt.model_bytes = 0;
  sopt.api_keys = o.api_keys;
  sopt.share_cache = o.share_cache;
  sopt.http_threads = o.http_threads;
  sopt.metrics_key = o.metrics_key;
  sopt.max_queue = o.max_queue;
  sopt.max_prompt_bytes = static_cast<size_t>(o.max_prompt_bytes);
  sopt.log_format = o.log_format == "json" ? server::LogFormat::kJson : server::LogFormat::kText;
  sopt.reasoning_format = o.reasoning_format;
  if (grid_head) {
    sopt.health = [grid_head] {
      const grid::HeadHealth h = grid_head->health();
      return std::make_pair(h.ok, h.message);
    };
    sopt.extra_metrics = [grid_head] { return GridMetricsText(*grid_head); };
  }
  if (bridge) {
    // The store's reachability, reported, never a reason to be unhealthy.
    sopt.health_fields = [bridge] {
      const size_t up = bridge->client().ReachableMembers(), all = bridge->client().Members().size();
      return std::vector<std::pair<std::string, std::string>>{
          {"store", up == 0 ? "down" : up < all ? fmt::format("{} of {} servers reachable", up, all) : "up"}};
    };
    auto grid_metrics = sopt.extra_metrics;
    sopt.extra_metrics = [bridge, grid_metrics] {
      std::string out = grid_metrics ? grid_metrics() : "";
      out += fmt::format(
          "# HELP trellis_store_servers prefix store servers this engine knows\n# TYPE trellis_store_servers gauge\n"
          "trellis_store_servers {}\n"
          "# HELP trellis_store_servers_reachable of them, those that answered when last tried\n"
          "# TYPE trellis_store_servers_reachable gauge\ntrellis_store_servers_reachable {}\n",
          bridge->client().Members().size(), bridge->client().ReachableMembers());
      return out;
    };
  }
  const int head_layers = (*model)->part().last_layer;
  sopt.cache_view_sections = [bridge, grid_head, head_layers] {
    std::vector<std::pair<std::string, std::string>> out;
    if (bridge) out.emplace_back("store", StoreViewJson(*bridge));
    if (grid_head) out.emplace_back("grid", GridViewJson(*grid_head, head_layers));
    return out;
  };
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  sopt.http.max_body = static_cast<size_t>(o.max_body);
  sopt.http.max_decoded_body = static_cast<size_t>(o.max_decoded_body > 0 ? o.max_decoded_body : o.max_body);
  sopt.http.max_connections = o.max_connections;
  sopt.http.header_timeout = ms(o.header_timeout);
  sopt.http.body_timeout = ms(o.body_timeout);
  sopt.http.idle_timeout = ms(o.idle_timeout);
  sopt.http.write_timeout = ms(o.write_timeout);
  server::Server srv(**model, **tok, *chat, **engine, sopt);
  if (Status s = srv.Bind(); !s.ok()) return Fail(s.message());

  const SchedulerOptions& eo = (*engine)->options();
  std::fprintf(stderr,
               "trellis serve: listening on http://%s:%d | model %s (%s) | ctx %d | kv %s/%s, %lld blocks of %d = %lld tokens "
               "at %.0f bytes each | template %s (%s), tool calls %s | auth %s | %s\n",
               o.host.c_str(), srv.port(), sopt.model_id.c_str(), (*model)->TypeSummary().c_str(), eo.n_ctx,
               KvTypeName(eo.kv_type_k), KvTypeName(eo.kv_type_v), static_cast<long long>(eo.kv_blocks), eo.block_size,
               static_cast<long long>(eo.kv_blocks) * eo.block_size, (*engine)->metrics().kv_bytes_per_token,
               std::string(chat->name()).c_str(),
               template_source.c_str(), server::ToolCallFormatName(srv.tool_format()),
               o.api_keys.empty() ? "off" : (std::to_string(o.api_keys.size()) + " key(s)").c_str(),
               ThreadsText(o.threads, threads_how).c_str());
  if (grid_head) {
    const int here = (*model)->part().last_layer;
    const std::string mine = here == 0 ? "no layers" : fmt::format("layers 0-{}", here - 1);
    std::fprintf(stderr, "trellis serve: grid head with %s here; nodes %s | %d micro-batches in flight, prefill chunk %d\n",
                 mine.c_str(), o.grid.grid.c_str(), o.grid.depth, eo.prefill_chunk);
  }
  if (bridge) {
    const StoreBridgeStats bs = bridge->stats();
    if (bridge->client().ReachableMembers() == 0) {
      std::fprintf(stderr, "trellis serve: prefix store %s is down: serving without it, joining it when it comes up\n",
                   o.store.store.c_str());
    } else {
      std::fprintf(stderr, "trellis serve: prefix store %s (%zu members; get %.0f MiB/s, lookup %.2f ms, probed at start)\n",
                   o.store.store.c_str(), bridge->client().Members().size(), bs.get_bytes_per_second / (1 << 20),
                   bs.lookup_seconds * 1e3);
    }
  }

  // The first signal starts a graceful shutdown (no new connections, streams end with an
  // error event and [DONE], queued requests get 503) bounded by --shutdown-timeout; a
  // second signal, or the deadline, ends the process at once.
  std::atomic<bool> finished{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (finished) return;
    std::fprintf(stderr, "trellis serve: %s, shutting down (%.0f s at most; again to exit now)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
    srv.Stop();
    timespec deadline{};
    deadline.tv_sec = static_cast<time_t>(o.shutdown_timeout);
    deadline.tv_nsec = static_cast<long>((o.shutdown_timeout - static_cast<double>(deadline.tv_sec)) * 1e9);
    siginfo_t info;
    const int again = sigtimedwait(&sigs, &info, &deadline);
    if (finished) return;
    std::fprintf(stderr, "trellis serve: %s; exiting now\n",
                 again > 0 ? "second signal" : "shutdown deadline passed with requests still open");
    std::fflush(stderr);
    std::_Exit(again > 0 ? 130 : 1);
  });
  srv.Run();
  // Run returns after Stop (from the waiter) or if listening failed: make the waiter exit.
  finished = true;
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  std::fprintf(stderr, "trellis serve: stopped\n");
  return 0;
}

}  // namespace

Runner AddServeCommand(CLI::App& app) {
  auto o = std::make_shared<ServeOpts>();
  app.add_option("-m,--model", o->model, "GGUF model file")->required();
  app.add_option("--host", o->host, "address to bind")->capture_default_str();
  app.add_option("--port", o->port, "port to bind (0 = any free port)")->capture_default_str();
  app.add_option("-t,--threads", o->threads, kThreadsHelp);
  app.add_option("-c,--ctx-size", o->ctx, "context per request (0 = model's, capped at 4096)");
  app.add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
  app.add_option("--kv-memory", o->kv_memory, "KV pool bytes (0 = four full contexts)");
  app.add_option("--kv-blocks", o->kv_blocks, "KV pool size in blocks (overrides --kv-memory)");
  AddKvTypeFlags(app, &o->kv_types);
  app.add_option("--max-queue", o->max_queue, "requests waiting for admission before 503")->capture_default_str();
  app.add_option("--max-running", o->max_running, "requests decoded together")->capture_default_str();
  app.add_option("-b,--batch", o->batch, "tokens per engine step")->capture_default_str();
  app.add_option("--chat-template", o->chat_template,
                 "a built-in template (" + server::ChatTemplate::KnownNames() + ") or a Jinja file (default: the model's own template)");
  app.add_option("--alias", o->alias, "model name to report and accept (default: the file name)");
  app.add_flag("--no-webui", o->no_webui, "no chat page at / (it asks the API key of a keyed server; it holds no secrets)");
  app.add_option("--webui-path", o->webui_path, "serve this folder's index.html at / and its files at /webui/NAME instead of the embedded page")
      ->check(CLI::ExistingDirectory);
  app.add_option("--api-key", o->api_keys, "require 'Authorization: Bearer KEY' (repeat for several tenants)");
  app.add_option("--api-key-file", o->api_key_file, "file with one API key per line");
  app.add_flag("--share-cache", o->share_cache, "let different API keys share cached prefixes");
  app.add_flag("--no-prefix-cache", o->no_prefix_cache, "compute every prompt whole (no local prefix cache; for comparisons)");
  app.add_option("--http-threads", o->http_threads, "HTTP worker threads (0 = max-running + 32)");
  app.add_option("--metrics-key", o->metrics_key, "key /metrics requires (default: any --api-key; open without keys)");
  app.add_option("--max-body", o->max_body, "request body limit as sent, K/M/G suffixes (413 beyond)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--max-decoded-body", o->max_decoded_body, "request body limit after decompression (0 = --max-body)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-prompt-bytes", o->max_prompt_bytes,
                 "prompt text limit checked before tokenizing (0 = context x longest token)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--max-connections", o->max_connections, "open client connections (503 beyond)")
      ->capture_default_str();
  app.add_option("--header-timeout", o->header_timeout, "seconds for a whole request head")->capture_default_str();
  app.add_option("--body-timeout", o->body_timeout, "seconds for a whole request body")->capture_default_str();
  app.add_option("--idle-timeout", o->idle_timeout, "seconds a keep-alive connection may idle")->capture_default_str();
  app.add_option("--write-timeout", o->write_timeout, "seconds a write may wait for a client that does not read")
      ->capture_default_str();
  app.add_option("--shutdown-timeout", o->shutdown_timeout, "seconds to finish streams after SIGTERM")
      ->capture_default_str();
  AddStoreFlags(app, &o->store);
  AddGridFlags(app, &o->grid);
  app.add_option("--log-format", o->log_format, "access log on stderr: text or json")->capture_default_str();
  app.add_option("--reasoning-format", o->reasoning_format,
                 "deepseek: a thinking model's <think> block goes to reasoning_content; none: it stays in content")
      ->capture_default_str();
  return [o] { return Serve(*o); };
}

}  // namespace trellis::cli
