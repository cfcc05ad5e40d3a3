// trellis run: generate text for a prompt (or given token ids) and report speed.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "cli/store_flags.h"
#include "engine/run_one.h"
#include "engine/scheduler.h"
#include "util/clock.h"
#include "model/tokenizer.h"

namespace trellis::cli {
namespace {

struct RunOpts {
  std::string model, prompt, tokens, force_tokens, dump_logits, prompt_file;
  int n_predict = 64;
  int threads = 0;  // 0: the physical cores this process may use
  std::string threads_how;  // how the default was chosen ("" with -t)
  int ctx = 0;
  int block_size = 32;
  int batch = 512;
  int64_t kv_memory = 0;
  int64_t kv_blocks = 0;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int top_k = 40, repeat_last_n = 64;
  uint64_t seed = 0xC0FFEE;
  bool print_ids = false, no_bos = false, ignore_eos = false, quiet = false;
  StoreFlags store;
  KvTypeFlags kv_types;

  SamplerParams Sampling() const {
    SamplerParams p;
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repeat_penalty = repeat_penalty;
    p.repeat_last_n = repeat_last_n;
    p.seed = seed;
    return p;
  }
};

Result<std::vector<int32_t>> ParseIds(const std::string& s, const std::string& flag = "--tokens") {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t pos = 0;
    long v = 0;
    try {
      v = std::stol(item, &pos);
    } catch (...) {
      return InvalidArgument(flag + ": '" + item + "' is not an integer");
    }
    if (pos != item.size() || v < 0 || v > INT32_MAX) return InvalidArgument(flag + ": '" + item + "' is not a token id");
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) return InvalidArgument(flag + " is empty");
  return out;
}

// Rejects option values the engine would silently misread (a negative count taken as
// "default", a NaN temperature sampling garbage). Empty string = all valid.
std::string CheckOpts(const RunOpts& o) {
  if (o.n_predict < 0) return "-n " + std::to_string(o.n_predict) + ": the number of tokens to generate must be >= 0";
  if (o.ctx < 0) return "--ctx-size " + std::to_string(o.ctx) + " must be >= 0 (0 = the model's)";
  if (o.kv_blocks < 0) return "--kv-blocks must be >= 0 (0 = from --kv-memory)";
  if (o.kv_memory < 0) return "--kv-memory " + std::to_string(o.kv_memory) + " must be >= 0 (0 = one full context)";
  if (!std::isfinite(o.temp)) return "--temp must be a finite number (0 = greedy)";
  if (!(o.top_p >= 0.0f && o.top_p <= 1.0f)) return "--top-p must be in [0, 1]";
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) return "--min-p must be in [0, 1]";
  if (!(o.repeat_penalty > 0.0f) || !std::isfinite(o.repeat_penalty)) return "--repeat-penalty must be > 0 (1 = off)";
  if (o.top_k < 0) return "--top-k must be >= 0 (0 = off)";
  return {};
}

// --prompt-file (or --store): every prompt runs concurrently through the scheduler over
// one shared prefix cache (and the store), and where each session's prompt K/V came from
// is reported.
int RunMany(const RunOpts& o, const Model& model, const Tokenizer& tok, std::vector<std::string> prompts) {
  auto store = ConnectStore(o.store);
  if (!store.ok()) return Fail(store.status().ToString());
  SchedulerOptions so;
  so.store = store->get();
  so.block_size = o.block_size;
  so.kv_type_k = o.kv_types.K();
  so.kv_type_v = o.kv_types.V();
  so.n_ctx = o.ctx;
  so.kv_memory_bytes = o.kv_memory;
  so.kv_blocks = o.kv_blocks;
  so.max_batch_tokens = o.batch;
  so.prefill_chunk = o.batch;
  so.max_running = static_cast<int>(prompts.size());
  ThreadPool threads(o.threads);
  auto sched = Scheduler::Create(model, so, threads);
  if (!sched.ok()) return Fail(sched.status().ToString());
  std::vector<RequestResult> results(prompts.size());
  std::vector<std::string> texts(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = tok.Encode(prompts[i], !o.no_bos && tok.add_bos(), true);
    r.max_tokens = o.n_predict;
    r.sampling = o.Sampling();
    r.sampling.seed = o.seed + i;  // distinct streams per session
    if (!o.ignore_eos) r.is_stop = [&tok](int32_t id) { return tok.IsEog(id); };
    auto id = (*sched)->Submit(std::move(r), nullptr, [&results, i](RequestId, const RequestResult& res) { results[i] = res; });
    if (!id.ok()) return Fail("prompt " + std::to_string(i + 1) + ": " + id.status().ToString());
  }
  const double t0 = NowSeconds();
  (*sched)->RunUntilIdle();
  const double secs = NowSeconds() - t0;
  int64_t generated = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestResult& r = results[i];
    if (r.reason == FinishReason::kError) return Fail("prompt " + std::to_string(i + 1) + ": " + r.error.ToString());
    generated += static_cast<int64_t>(r.tokens.size());
    std::string text = tok.Decode(r.tokens);
    if (!o.ignore_eos && !r.tokens.empty() && tok.IsEog(r.tokens.back())) text = tok.Decode({r.tokens.data(), r.tokens.size() - 1});
    std::printf("[%zu] %s%s\n", i + 1, prompts[i].c_str(), text.c_str());
  }
  if (!o.quiet) {
    std::fprintf(stderr, "\n| session | prompt tokens | cached tokens | of which local | from store | computed | generated | TTFT ms | finish |\n"
                 "|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < prompts.size(); ++i) {
      const RequestResult& r = results[i];
      std::fprintf(stderr, "| %zu | %d | %d | %d | %d | %d | %zu | %.1f | %s |\n", i + 1, r.n_prompt, r.n_cached,
                   r.cache.local, r.cache.store, r.cache.computed, r.tokens.size(), r.ttft_seconds * 1e3,
                   FinishReasonName(r.reason));
    }
    const SchedulerMetrics m = (*sched)->metrics();
    std::fprintf(stderr, "%zu sessions in %.2f s: %.1f generated tok/s; cache hit rate %.1f%% (%ld of %ld prompt tokens), "
                 "KV blocks allocated %ld, acquired %ld\n", prompts.size(), secs, generated / std::max(secs, 1e-9),
                 100 * m.HitRate(), static_cast<long>(m.cached_tokens), static_cast<long>(m.prompt_tokens),
                 static_cast<long>(m.blocks_allocated), static_cast<long>(m.blocks_acquired));
  }
  return 0;
}

int Run(const RunOpts& o) {
  if (std::string bad = CheckOpts(o); !bad.empty()) return Fail(bad);
  auto model = Model::Load(o.model);
  if (!model.ok()) return Fail(model.status().ToString());
  const ModelConfig& c = (*model)->config();
  std::unique_ptr<Tokenizer> tok;
  if (auto t = Tokenizer::FromGguf((*model)->gguf()); t.ok()) {
    tok = std::move(t).value();
  } else if (o.tokens.empty()) {
    return Fail(t.status().ToString());
  }

  if (!o.prompt_file.empty()) {
    if (!tok) return Fail("--prompt-file needs a model with a tokenizer");
    std::ifstream f(o.prompt_file);
    if (!f) return Fail("cannot read --prompt-file " + o.prompt_file);
    std::vector<std::string> prompts;
    for (std::string line; std::getline(f, line);) {
      if (!line.empty()) prompts.push_back(line);
    }
    if (prompts.empty()) return Fail("--prompt-file " + o.prompt_file + " has no prompts");
    return RunMany(o, **model, *tok, std::move(prompts));
  }
  if (!o.store.store.empty()) {
    // The store is reached through the scheduler, which runs text prompts.
    if (!tok || !o.tokens.empty() || !o.dump_logits.empty() || !o.force_tokens.empty()) {
      return Fail("--store runs -p or --prompt-file prompts (not --tokens, --dump-logits or --force-tokens)");
    }
    return RunMany(o, **model, *tok, {o.prompt});
  }
  std::vector<int32_t> prompt;
  if (!o.tokens.empty()) {
    auto ids = ParseIds(o.tokens);
    if (!ids.ok()) return Fail(ids.status().message());
    prompt = *ids;
  } else {
    prompt = tok->Encode(o.prompt, !o.no_bos && tok->add_bos(), true);
  }

  // One session on the Scheduler, the driver `serve` uses. The pool holds one full
  // context unless --kv-memory / --kv-blocks say otherwise.
  SchedulerOptions so;
  so.block_size = o.block_size;
  so.kv_type_k = o.kv_types.K();
  so.kv_type_v = o.kv_types.V();
  so.n_ctx = o.ctx;
  so.kv_memory_bytes = o.kv_memory;
  so.kv_blocks = o.kv_blocks;
  if (so.kv_blocks == 0 && so.kv_memory_bytes == 0 && o.block_size > 0) {
    const int n_ctx = o.ctx > 0 ? o.ctx : c.DefaultContext();
    so.kv_blocks = (n_ctx + o.block_size - 1) / o.block_size;
  }
  so.max_batch_tokens = o.batch;
  so.prefill_chunk = o.batch;
  so.max_running = 1;
  so.prefix_cache = false;
  so.prompt_logits = !o.dump_logits.empty();
  ThreadPool threads(o.threads);
  auto sched = Scheduler::Create(**model, so, threads);
  if (!sched.ok()) return Fail(sched.status().ToString());

  if (!o.quiet) {
    std::fprintf(stderr, "model: %s | %s | %d layers, %d embd, %d heads (%d kv) | vocab %d | %s\n",
                 o.model.c_str(), (*model)->TypeSummary().c_str(), c.n_layer, c.n_embd, c.n_head, c.n_head_kv,
                 c.n_vocab, ThreadsText(o.threads, o.threads_how).c_str());
  }
  Request req;
  req.prompt = prompt;
  req.max_tokens = o.n_predict;
  req.prompt_logits = !o.dump_logits.empty();
  std::vector<int32_t> forced;
  if (!o.force_tokens.empty()) {
    auto ids = ParseIds(o.force_tokens, "--force-tokens");
    if (!ids.ok()) return Fail(ids.status().message());
    forced = std::move(*ids);
    // Every forced token is fed; with --dump-logits one step more gives the row after the
    // last of them (a step reports the logits its token is drawn from).
    req.force_tokens = forced;
    if (!o.dump_logits.empty()) {
      req.force_tokens.push_back(forced.back());
      req.logits = true;
    }
    req.max_tokens = static_cast<int>(req.force_tokens.size());
  }
  req.sampling = o.Sampling();
  if (tok && !o.ignore_eos && forced.empty()) req.is_stop = [&](int32_t id) { return tok->IsEog(id); };

  std::unique_ptr<StreamDecoder> dec;
  if (tok && !o.print_ids) {
    dec = std::make_unique<StreamDecoder>(*tok);
    std::fputs(o.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  std::vector<int32_t> generated;  // what was streamed, kept if generation fails midway
  auto on_token = [&](int32_t id) {
    if (!forced.empty() && generated.size() >= forced.size()) return true;  // the extra step for the last row
    generated.push_back(id);
    if (dec && !(tok->IsEog(id) && !o.ignore_eos)) {
      std::string s = dec->Push(id);
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto run = RunOne(**sched, req, on_token);
  // The scheduler ends a session the whole pool cannot hold as context-full; for `run`,
  // whose pool is its own, that is the pool running out before the context: an error.
  if (run.ok() && run->result.reason == FinishReason::kContextFull &&
      run->result.n_prompt + static_cast<int>(run->result.tokens.size()) <= (*sched)->options().n_ctx) {
    run = ResourceExhausted(fmt::format("KV pool exhausted: {} blocks of {} tokens hold no more of this sequence (raise --kv-memory)",
                                        (*sched)->options().kv_blocks, (*sched)->options().block_size));
  }
  if (!run.ok()) {
    // Keep what was generated before the failure (e.g. the KV pool ran out midway).
    if (o.print_ids) {
      for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? " " : "", generated[i]);
      if (!generated.empty()) std::printf("\n");
    } else if (dec) {
      std::string s = dec->Flush();
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    return Fail(run.status().ToString() + (generated.empty() ? "" : " (after " + std::to_string(generated.size()) + " generated tokens, printed above)"));
  }
  const RequestResult* res = &run->result;
  if (dec) {
    std::string s = dec->Flush();
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
  }
  if (o.print_ids) {
    for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? " " : "", generated[i]);
    std::printf("\n");
  }
  if (!o.dump_logits.empty()) {
    std::ofstream f(o.dump_logits, std::ios::binary);
    f.write(reinterpret_cast<const char*>(res->prompt_logits.data()),
            static_cast<std::streamsize>(res->prompt_logits.size() * sizeof(float)));
    // With --force-tokens, then one row per decode step (after each forced token was fed):
    // the step logits without the first (the last prompt position's, already written).
    if (!forced.empty() && run->step_logits.size() > static_cast<size_t>(c.n_vocab)) {
      f.write(reinterpret_cast<const char*>(run->step_logits.data() + c.n_vocab),
              static_cast<std::streamsize>((run->step_logits.size() - c.n_vocab) * sizeof(float)));
    }
    if (!f) return Fail("cannot write " + o.dump_logits);
  }
  const bool context_full = res->reason == FinishReason::kContextFull;
  if (context_full && o.quiet) {
    std::fprintf(stderr, "trellis: stopped at the context limit (%d positions) after %zu tokens; raise --ctx-size\n",
                 (*sched)->options().n_ctx, generated.size());
  }
  if (!o.quiet) {
    const int n_gen = static_cast<int>(generated.size());
    // Prefill is submit to the first token; generation the rest.
    const double prompt_s = res->ttft_seconds, gen_s = res->total_seconds - res->ttft_seconds;
    std::fprintf(stderr, "\nprompt: %d tokens in %.3f s (%.1f tok/s) | TTFT %.1f ms | generation: %d tokens, %.1f tok/s%s\n",
                 res->n_prompt, prompt_s, res->n_prompt / std::max(prompt_s, 1e-9), res->ttft_seconds * 1e3, n_gen,
                 n_gen > 1 ? (n_gen - 1) / std::max(gen_s, 1e-9) : 0.0, context_full ? " (stopped: context full)" : "");
  }
  return 0;
}

}  // namespace

Runner AddRunCommand(CLI::App& app) {
  auto o = std::make_shared<RunOpts>();
  app.add_option("-m,--model", o->model, "GGUF model file")->required();
  app.add_option("-p,--prompt", o->prompt, "prompt text");
  app.add_option("--tokens", o->tokens, "prompt as comma-separated token ids (used as given, no BOS added)");
  app.add_option("-n,--n-predict", o->n_predict, "tokens to generate")->capture_default_str();
  app.add_option("-t,--threads", o->threads, kThreadsHelp);
  app.add_option("-c,--ctx-size", o->ctx, "context size (0 = model's, capped at 4096)");
  app.add_option("--block-size", o->block_size, "KV block size in tokens")->capture_default_str();
  app.add_option("--kv-memory", o->kv_memory, "KV pool bytes (0 = one full context)");
  app.add_option("--kv-blocks", o->kv_blocks, "KV pool size in blocks (overrides --kv-memory)");
  AddKvTypeFlags(app, &o->kv_types);
  app.add_option("-b,--batch", o->batch, "prefill chunk (tokens per forward pass)")->capture_default_str();
  app.add_option("--temp", o->temp, "temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", o->top_k, "top-k (0 = off)")->capture_default_str();
  app.add_option("--top-p", o->top_p, "top-p (1 = off)")->capture_default_str();
  app.add_option("--min-p", o->min_p, "min-p (0 = off)")->capture_default_str();
  app.add_option("--repeat-penalty", o->repeat_penalty, "repetition penalty (1 = off)")->capture_default_str();
  app.add_option("--repeat-last-n", o->repeat_last_n, "window of the repetition penalty")->capture_default_str();
  app.add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  app.add_flag("--print-token-ids", o->print_ids, "print generated ids on one stdout line instead of text");
  app.add_option("--dump-logits", o->dump_logits,
                 "write f32 LE logits: one row per prompt position (then, with --force-tokens, one per forced token)");
  app.add_option("--force-tokens", o->force_tokens,
                 "teacher forcing: feed these comma-separated ids one at a time instead of sampling (with "
                 "--dump-logits: len(prompt) + len(forced) rows)");
  app.add_flag("--no-bos", o->no_bos, "do not add BOS to a text prompt");
  app.add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-generation tokens");
  app.add_flag("-q,--quiet", o->quiet, "no banner or speed line");
  app.add_option("--prompt-file", o->prompt_file,
                 "one prompt per line, all run concurrently over the shared prefix cache; prints cached tokens per session");
  AddStoreFlags(app, &o->store);
  return [o] {
    const int sources = !o->prompt.empty() + !o->tokens.empty() + !o->prompt_file.empty();
    if (sources == 0) return Fail("give a prompt with -p, token ids with --tokens, or --prompt-file");
    if (sources > 1) return Fail("-p, --tokens and --prompt-file are mutually exclusive");
    if (o->threads < 0 || o->threads > 1024) return Fail("--threads must be in 1..1024 (0 = the physical cores available)");
    o->threads = ResolveThreads(o->threads, &o->threads_how);
    return Run(*o);
  };
}

Runner AddTokenizeCommand(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto no_bos = std::make_shared<bool>(false);
  auto ids_only = std::make_shared<bool>(false);
  app.add_option("-m,--model", *model, "GGUF model or vocab file")->required();
  app.add_option("-p,--prompt", *text, "text to tokenize")->required();
  app.add_flag("--no-bos", *no_bos, "do not add BOS");
  app.add_flag("--ids", *ids_only, "print only the ids, space separated");
  return [=] {
    auto g = GgufFile::Open(*model);
    if (!g.ok()) return Fail(g.status().ToString());
    auto tok = Tokenizer::FromGguf(*g);
    if (!tok.ok()) return Fail(tok.status().ToString());
    const std::vector<int32_t> ids = (*tok)->Encode(*text, !*no_bos && (*tok)->add_bos(), true);
    if (*ids_only) {
      for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
      std::printf("\n");
      return 0;
    }
    for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, (*tok)->TokenToPiece(id, true).c_str());
    std::printf("%zu tokens\n", ids.size());
    return 0;
  };
}

}  // namespace trellis::cli
