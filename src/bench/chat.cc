// trellis bench chat: the multi-turn chat workload, where prefix reuse to the token pays.
//
// Workload: C conversations run in parallel (one thread each, started together). A
// conversation is a system prompt of about S tokens (the bookshop text of `bench serve`,
// sized with the server's /tokenize) and T turns. Turn t sends the whole conversation so
// far (system, user 1, assistant 1, ..., user t) as a streamed /v1/chat/completions with
// stream_options.include_usage, max_tokens M and temperature 0; the user message is W
// words drawn deterministically from (seed, conversation, turn), so every turn of every
// conversation asks something new; the assistant messages are the reply texts exactly as
// the server streamed them. A server that kept turn t's prompt and reply in its cache
// computes only what is new in turn t+1: the reply's re-rendered end-of-turn, the user
// message and the generation prompt.
//
// Measured per turn: TTFT = sending the request to the first streamed chunk whose content
// is not empty (HTTP, the same client code for both servers), prompt tokens, cached
// tokens (usage.prompt_tokens_details.cached_tokens; llama-server reports the same number
// there and as timings.cache_n, which is kept apart in the CSV) and completion tokens.
// Reported per turn: the median over conversations; and the mean over turns 2..T of those
// medians, turn 1 being the cold one, with the ratio trellis / llama-server.
//
// Servers: without --url, `trellis serve -m MODEL --port 0 --threads N` is started as a
// child process; with --llama-server PATH, llama-server on the same model is started after
// the trellis run ends (never both at once), with TinyLlama-Chat's Jinja template so both
// render the same prompt text (bench/serve_compare.py explains the flags), -np one slot per
// conversation, and runs the same workload. Each server first gets `warmup` unmeasured
// one-token requests with an unrelated user message (weights paged in, threads spun up).
//
// Random-weight models: trellis has no ignore_eos, so a reply may end early at an
// end-of-generation token (rare with random logits; completion tokens are reported).
// llama-server gets "ignore_eos": true. Both servers get, by default, the same logit_bias
// banning token ids 0..258 (control and byte tokens: with random weights llama-server
// answers HTTP 500 otherwise, and a reply of raw bytes re-tokenizes differently), so both
// sample from the same vocabulary and their conversations stay comparable token for token.
//
// Output: a markdown table on stdout (or one JSON object with --json), OUT/chat.csv (one
// row per server, conversation and turn, behind `# key: value` lines with the date, git
// commit, CPU, kernel ISA and command), OUT/chat.png (gnuplot, from OUT/chat.gp) and the
// servers' logs OUT/trellis-serve.log, OUT/llama-server.log.
#include "bench/chat.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <latch>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/http.h"
#include "bench/report.h"
#include "kernels/cpu_features.h"

#ifndef TRELLIS_SOURCE_DIR
#define TRELLIS_SOURCE_DIR "."
#endif

namespace trellis::bench {
using namespace trellis::bench;  // NOLINT: the HTTP client pieces (bench/http.h)
namespace {

using nlohmann::json;

// One measured turn. Times are seconds from sending the request; -1 = not reported.
struct TurnResult {
  int conversation = 0, turn = 0;  // turn counts from 1
  std::string error;               // empty = ok
  double ttft = -1, e2e = 0;
  int64_t prompt_tokens = -1, cached_tokens = -1, cache_n = -1, completion_tokens = -1;
  std::string reply;
  json calls = json::array();  // streamed tool calls, assembled: [{id, type, function: {name, arguments}}]
};

// One server's run of the whole workload.
struct ServerRun {
  std::string label, url;
  std::vector<TurnResult> turns;  // conversation-major: [c * T + (turn - 1)]
};

// --- the workload ---------------------------------------------------------------------

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The user message of (conversation, turn): `n_words` words, a question.
std::string Question(uint64_t seed, int conversation, int turn, int n_words) {
  static const char* kWords[] = {
      "could", "you", "tell", "me", "whether", "my", "novel", "about", "sailors", "has", "left",
      "the", "warehouse", "yet", "and", "how", "long", "a", "paperback", "edition", "would", "take",
      "to", "reach", "small", "village", "near", "coast", "if", "I", "pay", "for", "express",
      "shipping", "today", "also", "is", "there", "discount", "on", "second", "copy", "as", "gift",
      "wrapped", "in", "blue", "paper", "with", "card", "saying", "happy", "birthday", "from", "all",
      "of", "us", "which", "atlas", "cookbook", "poetry", "collection", "arrives", "first", "please"};
  constexpr uint64_t kN = sizeof(kWords) / sizeof(kWords[0]);
  uint64_t x = seed * 0x100000001B3ull ^ (static_cast<uint64_t>(conversation) << 32) ^ static_cast<uint64_t>(turn);
  std::string s;
  for (int i = 0; i < n_words; ++i) {
    std::string w = kWords[SplitMix(x) % kN];
    if (i == 0 && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
    s += (i ? " " : "") + w;
  }
  return s + "?";
}

// `bench agent`'s tools: `n` functions of a made-up shop's API, each with a description
// and four typed parameters; deterministic.
json MakeTools(int n) {
  static const char* kVerbs[] = {"search", "get", "list", "update", "cancel", "create", "refund", "track"};
  static const char* kThings[] = {"order", "book", "customer", "invoice", "shipment", "review", "coupon", "author"};
  json tools = json::array();
  for (int i = 0; i < n; ++i) {
    const std::string verb = kVerbs[i % 8], thing = kThings[(i / 8) % 8];
    const std::string name = verb + "_" + thing + (i >= 64 ? "_" + std::to_string(i / 64) : "");
    json props = {{"query", {{"type", "string"}, {"maxLength", 24}, {"description", "What to " + verb + ", in words."}}},
                  {"limit", {{"type", "integer"}, {"description", "At most this many " + thing + "s."}}},
                  {"status", {{"enum", {"open", "closed", "pending"}}, {"description", "Only " + thing + "s in this state."}}},
                  {"exact", {{"type", "boolean"}, {"description", "Match the query exactly."}}}};
    tools.push_back({{"type", "function"},
                     {"function", {{"name", name},
                                   {"description", "Use this to " + verb + " a " + thing + " of the shop's catalogue "
                                                   "or records. Returns a JSON object with the " + thing +
                                                   "s found and a cursor for more."},
                                   {"parameters", {{"type", "object"}, {"properties", props},
                                                   {"required", {"query", "limit"}}, {"additionalProperties", false}}}}}});
  }
  return tools;
}

json RequestBody(const ChatBenchOptions& o, const json& messages, int max_tokens, bool llama, const json& tools = {},
                 bool forced = true) {
  json b = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  if (!tools.empty()) {  // a forced call (a random model calls nothing by itself); ends when the call does
    b["tools"] = tools;
    b["tool_choice"] = forced ? "required" : "auto";
    b["parallel_tool_calls"] = false;
  } else if (llama) {
    b["ignore_eos"] = true;
  }
  if (o.llama_ban_bytes) {  // llama.cpp's form, which trellis also takes: [[token id, false]] bans it
    // Agents keep the end token (2: it ends a call) and the ASCII byte tokens (3..130: the
    // call syntax writes "\n"), banning only <unk>, <s> and the bytes >= 0x80, which are
    // not whole UTF-8 (LLaMA's vocabulary, the default model's).
    json ban = json::array();
    for (int i = 0; i <= 258; ++i) {
      if (tools.empty() || i < 2 || i > 130) ban.push_back(json::array({i, false}));
    }
    b["logit_bias"] = ban;
  }
  return b;
}

// Sends one turn and reads the streamed answer: the reply text, TTFT, usage.
TurnResult SendTurn(httplib::Client& cli, const std::string& path, const json& body) {
  TurnResult r;
  bool usage = false;
  const SseOutcome out = PostSse(cli, path, body.dump(), [&](const json& ev, double t) {
    if (ev.contains("error")) {
      r.error = "stream error: " + ev["error"].dump().substr(0, 200);
      return false;
    }
    if (ev.contains("usage") && ev["usage"].is_object()) {
      const json& u = ev["usage"];
      usage = true;
      r.prompt_tokens = u.value("prompt_tokens", int64_t{-1});
      r.completion_tokens = u.value("completion_tokens", int64_t{-1});
      const auto d = u.find("prompt_tokens_details");
      if (d != u.end() && d->is_object() && d->contains("cached_tokens") && (*d)["cached_tokens"].is_number()) {
        r.cached_tokens = (*d)["cached_tokens"].get<int64_t>();
      }
    }
    if (ev.contains("timings") && ev["timings"].is_object() && ev["timings"].contains("cache_n") &&
        ev["timings"]["cache_n"].is_number()) {
      r.cache_n = ev["timings"]["cache_n"].get<int64_t>();
    }
    if (!ev.contains("choices") || !ev["choices"].is_array() || ev["choices"].empty()) return true;
    const json& c = ev["choices"][0];
    if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
        c["delta"]["content"].is_string()) {
      const std::string& text = c["delta"]["content"].get_ref<const std::string&>();
      if (!text.empty() && r.ttft < 0) r.ttft = t;
      r.reply += text;
    }
    if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("tool_calls") &&
        c["delta"]["tool_calls"].is_array()) {
      for (const json& d : c["delta"]["tool_calls"]) {  // OpenAI's pieces: index, then id, name, argument fragments
        if (!d.is_object() || !d.contains("index") || !d["index"].is_number_unsigned()) continue;
        const size_t k = d["index"].get<size_t>();
        if (k > 64) continue;
        while (r.calls.size() <= k) {
          r.calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
        }
        json& call = r.calls[k];
        if (d.contains("id") && d["id"].is_string()) call["id"] = d["id"];
        if (d.contains("function") && d["function"].is_object()) {
          const json& f = d["function"];
          if (f.contains("name") && f["name"].is_string()) call["function"]["name"] = call["function"]["name"].get<std::string>() + f["name"].get<std::string>();
          if (f.contains("arguments") && f["arguments"].is_string()) {
            call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() + f["arguments"].get<std::string>();
          }
        }
        if (r.ttft < 0) r.ttft = t;
      }
    }
    return true;
  });
  r.e2e = out.seconds;
  if (!r.error.empty()) return r;
  if (!out.error.empty()) {
    r.error = out.error;
  } else if (r.ttft < 0) {
    r.error = "no content or tool call in the stream";
  } else if (!usage || r.prompt_tokens < 0) {
    r.error = "no usage in the stream";
  }
  if (r.cached_tokens < 0) r.cached_tokens = r.cache_n;  // a server reporting only timings.cache_n
  return r;
}

// Runs the whole workload against `url`; `system` is the system prompt text.
// `replay` (agents against llama-server): the run whose calls this one's histories carry.
ServerRun RunWorkload(const ChatBenchOptions& o, const std::string& label, const std::string& url,
                      const std::string& system, bool llama, const json& tools, const ServerRun* replay = nullptr) {
  ServerRun run{label, url, std::vector<TurnResult>(static_cast<size_t>(o.conversations) * static_cast<size_t>(o.turns))};
  const Endpoint ep = ParseUrl(url);
  const std::string path = ep.prefix + "/v1/chat/completions";
  auto setup = MakeHttpClient(ep, o.timeout_s);
  for (int i = 0; i < o.warmup; ++i) {
    const json msgs = json::array({{{"role", "user"}, {"content", "Warm-up " + std::to_string(i) + "."}}});
    TurnResult w = SendTurn(*setup, path, RequestBody(o, msgs, 1, llama));
    if (!w.error.empty()) std::fprintf(stderr, "bench chat: %s: warm-up request failed: %s\n", label.c_str(), w.error.c_str());
  }
  std::latch start(o.conversations + 1);
  std::vector<std::thread> threads;
  for (int c = 0; c < o.conversations; ++c) {
    threads.emplace_back([&, c] {
      auto cli = MakeHttpClient(ep, o.timeout_s);
      json messages = json::array({{{"role", "system"}, {"content", system}}});
      start.arrive_and_wait();
      bool failed = false;
      for (int t = 1; t <= o.turns; ++t) {
        TurnResult& r = run.turns[static_cast<size_t>(c) * static_cast<size_t>(o.turns) + static_cast<size_t>(t - 1)];
        if (failed) {
          r = TurnResult{};
          r.error = "not sent: an earlier turn failed";
        } else {
          if (tools.empty() || t == 1) {
            messages.push_back({{"role", "user"}, {"content", Question(o.seed, c, t, o.question_words)}});
          }
          const TurnResult* replayed =
              replay ? &replay->turns[static_cast<size_t>(c) * static_cast<size_t>(o.turns) + static_cast<size_t>(t - 1)]
                     : nullptr;
          r = SendTurn(*cli, path, RequestBody(o, messages, replayed ? 8 : o.reply_tokens, llama, tools, !replayed));
          if (replayed && r.error.empty()) {
            // The same trace: the next turn carries the call the other server made.
            if (!replayed->error.empty()) r.error = "not sent: that turn failed on " + replay->label;
            r.calls = replayed->calls;
            r.reply = replayed->reply;
          }
          if (tools.empty()) {
            messages.push_back({{"role", "assistant"}, {"content", r.reply}});
          } else if (r.error.empty() && r.calls.size() != 1) {
            r.error = "expected one tool call, got " + std::to_string(r.calls.size()) + ": " + r.reply.substr(0, 200);
          } else if (r.error.empty()) {
            // The call as the server streamed it, and its result: the next turn's new part.
            messages.push_back({{"role", "assistant"}, {"content", r.reply.empty() ? json(nullptr) : json(r.reply)},
                                {"tool_calls", r.calls}});
            messages.push_back({{"role", "tool"}, {"tool_call_id", r.calls[0]["id"]},
                                {"content", json({{"found", t}, {"items", {Question(o.seed, c, t + 100, 6)}},
                                                  {"cursor", "c" + std::to_string(t)}}).dump()}});
          }
          failed = !r.error.empty();
        }
        r.conversation = c;
        r.turn = t;
        if (r.error.empty()) {
          std::fprintf(stderr, "bench chat: %s conversation %d turn %d: prompt %ld, cached %ld, reply %ld, TTFT %.0f ms\n",
                       label.c_str(), c, t, static_cast<long>(r.prompt_tokens), static_cast<long>(r.cached_tokens),
                       static_cast<long>(r.completion_tokens), r.ttft * 1e3);
        }
      }
    });
  }
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  return run;
}

// --- servers started here -------------------------------------------------------------

std::vector<std::string> SplitArgs(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string a; in >> a;) v.push_back(a);
  return v;
}

Result<std::string> StartTrellis(ChildProcess& p, const ChatBenchOptions& o) {
  std::vector<std::string> args = {"trellis", "serve", "-m", o.model, "--host", "127.0.0.1", "--port", "0",
                                   "--threads", std::to_string(o.threads)};
  if (!o.template_file.empty()) {
    args.push_back("--chat-template");
    args.push_back(o.template_file);
  }
  for (auto& a : SplitArgs(o.serve_args)) args.push_back(a);
  return p.Start("/proc/self/exe", std::move(args), o.out_dir + "/trellis-serve.log", "trellis serve");
}

int LlamaSlots(const ChatBenchOptions& o) { return o.llama_np > 0 ? o.llama_np : o.conversations; }

std::vector<std::string> LlamaArgs(const ChatBenchOptions& o) {
  const int np = LlamaSlots(o);
  std::vector<std::string> args = {o.llama_server, "-m", o.model, "-t", std::to_string(o.threads),
                                   "-c", std::to_string(o.llama_ctx > 0 ? o.llama_ctx : (o.tools > 0 ? 4096 : 2048) * np),
                                   "-np", std::to_string(np), "--host", "127.0.0.1", "--port", "0", "--no-webui",
                                   "--jinja", "--chat-template-file", o.llama_template};
  for (auto& a : SplitArgs(o.llama_args)) args.push_back(a);
  return args;
}

// --- statistics and output ------------------------------------------------------------

double MedianOrNan(const std::vector<double>& v) { return v.empty() ? NAN : bench::Median(v); }

// Per-turn medians over the conversations whose turn succeeded (NaN: none did, or the
// server did not report the figure).
struct TurnStats {
  double prompt = NAN, cached = NAN, completion = NAN, ttft_ms = NAN;
  int ok = 0;
};

std::vector<TurnStats> PerTurn(const ChatBenchOptions& o, const ServerRun& run) {
  std::vector<TurnStats> out(static_cast<size_t>(o.turns));
  for (int t = 1; t <= o.turns; ++t) {
    std::vector<double> p, c, g, f;
    for (const TurnResult& r : run.turns) {
      if (r.turn != t || !r.error.empty()) continue;
      p.push_back(static_cast<double>(r.prompt_tokens));
      if (r.cached_tokens >= 0) c.push_back(static_cast<double>(r.cached_tokens));
      if (r.completion_tokens >= 0) g.push_back(static_cast<double>(r.completion_tokens));
      f.push_back(r.ttft * 1e3);
    }
    TurnStats& s = out[static_cast<size_t>(t - 1)];
    s = {MedianOrNan(p), MedianOrNan(c), MedianOrNan(g), MedianOrNan(f), static_cast<int>(p.size())};
  }
  return out;
}

// Mean of the per-turn median TTFTs over turns 2..T (turn 1 when T = 1); NaN if none.
double MeanWarmTtft(const std::vector<TurnStats>& s) {
  double sum = 0;
  int n = 0;
  for (size_t i = s.size() > 1 ? 1 : 0; i < s.size(); ++i) {
    if (std::isnan(s[i].ttft_ms)) continue;
    sum += s[i].ttft_ms;
    ++n;
  }
  return n ? sum / n : NAN;
}

int Errors(const ServerRun& run) {
  int n = 0;
  for (const TurnResult& r : run.turns) n += r.error.empty() ? 0 : 1;
  return n;
}

std::string Num(double x, const char* fmt = "%.0f") {
  if (std::isnan(x)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, x == std::floor(x) ? "%.0f" : fmt, x);
  return b;
}

json NumJson(double x) { return std::isnan(x) ? json(nullptr) : json(x); }

// The command's output without its trailing line breaks.
std::string CaptureLine(const std::string& cmd) {
  std::string out = bench::Capture(cmd);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// `# key: value` lines for the CSV: where the numbers came from (bench/record.py's keys).
std::vector<std::pair<std::string, std::string>> Provenance(const ChatBenchOptions& o, int system_tokens) {
  std::vector<std::pair<std::string, std::string>> m;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  m.emplace_back("date", date);
  const std::string src = TRELLIS_SOURCE_DIR;
  std::string commit = CaptureLine("git -C '" + src + "' rev-parse --short HEAD 2>/dev/null");
  if (!commit.empty() &&
      std::system(("git -C '" + src + "' diff --quiet HEAD -- src include CMakeLists.txt 2>/dev/null").c_str()) != 0) {
    commit += "+dirty";
  }
  m.emplace_back("commit", commit.empty() ? "unknown" : commit);
  std::string cpu = "unknown", family = "?", model = "?";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon), v = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    while (!k.empty() && (k.back() == ' ' || k.back() == '\t')) k.pop_back();
    if (k == "model name" && cpu == "unknown") cpu = v;
    if (k == "cpu family" && family == "?") family = v;
    if (k == "model" && model == "?") model = v;
  }
  m.emplace_back("cpu", cpu + " (cpu family " + family + ", model " + model + ")");
  m.emplace_back("isa", KernelIsaName(BestKernelIsa()));
  m.emplace_back("cores", std::to_string(std::thread::hardware_concurrency()));
  m.emplace_back("threads", std::to_string(o.threads));
  m.emplace_back("model", o.model.empty() ? "(the server at " + o.url + ")" : o.model);
  if (!o.llama_server.empty()) {
    std::string v = CaptureLine("'" + o.llama_server + "' --version 2>&1 | grep -m1 version");
    m.emplace_back("llama_server", o.llama_server + (v.empty() ? "" : " (" + v + ")"));
  }
  m.emplace_back("system_tokens", std::to_string(system_tokens));
  std::string cmd;
  std::ifstream argv("/proc/self/cmdline", std::ios::binary);
  for (std::string a; std::getline(argv, a, '\0');) {
    const bool plain = !a.empty() && a.find_first_of(" \t'\"$\\*?;&|<>()") == std::string::npos;
    cmd += (cmd.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  m.emplace_back("command", cmd);
  return m;
}

Status WriteCsv(const ChatBenchOptions& o, int system_tokens, const std::vector<ServerRun>& runs) {
  const std::string path = o.out_dir + "/chat.csv";
  std::ofstream f(path);
  for (const auto& [k, v] : Provenance(o, system_tokens)) f << "# " << k << ": " << v << "\n";
  f << "server,conversation,turn,prompt_tokens,cached_tokens,cache_n,completion_tokens,ttft_ms,e2e_ms,error\n";
  for (const ServerRun& run : runs) {
    for (const TurnResult& r : run.turns) {
      std::string e = r.error;
      std::replace(e.begin(), e.end(), ',', ';');
      std::replace(e.begin(), e.end(), '\n', ' ');
      f << run.label << "," << r.conversation << "," << r.turn << "," << r.prompt_tokens << "," << r.cached_tokens << ","
        << r.cache_n << "," << r.completion_tokens << "," << (r.ttft >= 0 ? r.ttft * 1e3 : -1) << "," << r.e2e * 1e3
        << "," << e << "\n";
    }
  }
  if (!f) return IoError("cannot write " + path);
  return {};
}

void WritePlot(const ChatBenchOptions& o, int system_tokens, const std::vector<ServerRun>& runs,
               const std::vector<std::vector<TurnStats>>& stats, const std::string& summary) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "bench chat: gnuplot not found, chat.png skipped (apt-get install gnuplot-nox)\n");
    return;
  }
  const std::string gp = o.out_dir + "/chat.gp";
  std::string title = summary;
  std::replace(title.begin(), title.end(), '"', '\'');
  std::ofstream f(gp);
  f << "set terminal pngcairo size 1000,600 noenhanced\nset output '" << o.out_dir << "/chat.png'\n"
    << "set title \"Multi-turn chat: " << o.conversations << " conversation(s), system prompt " << system_tokens
    << " tokens, " << o.question_words << "-word questions, max_tokens " << o.reply_tokens << "\\n" << title << "\"\n"
    << "set xlabel 'turn'\nset ylabel 'TTFT (ms, median over conversations)'\nset y2label 'tokens'\n"
    << "set xtics 1\nset ytics nomirror\nset y2tics\nset yrange [0:*]\nset y2range [0:*]\nset grid\n"
    << "set key top left\nset datafile missing 'NaN'\n$d << EOD\n";
  for (int t = 1; t <= o.turns; ++t) {
    f << t;
    for (const auto& s : stats) {
      const TurnStats& x = s[static_cast<size_t>(t - 1)];
      f << " " << x.ttft_ms << " " << x.prompt << " " << x.cached;
    }
    f << "\n";
  }
  f << "EOD\nplot ";
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t col = 2 + 3 * i;
    f << (i ? ", " : "") << "$d using 1:" << col << " with linespoints lw 2 title 'TTFT " << runs[i].label << "', "
      << "$d using 1:" << col + 2 << " axes x1y2 with lines dt 2 title 'cached tokens " << runs[i].label << "'";
  }
  f << ", $d using 1:3 axes x1y2 with lines dt 3 lc rgb 'gray40' title 'prompt tokens (" << runs[0].label << ")'\n";
  f.close();
  if (std::system(("gnuplot '" + gp + "'").c_str()) != 0) std::fprintf(stderr, "bench chat: gnuplot failed\n");
}

}  // namespace

Status RunChatBench(const ChatBenchOptions& in) {
  ChatBenchOptions o = in;
  if (o.turns < 1 || o.system_tokens < 1 || o.question_words < 1 || o.reply_tokens < 1 || o.conversations < 1 ||
      o.threads < 1 || o.warmup < 0 || o.timeout_s < 1 || o.llama_np < 0 || o.llama_ctx < 0) {
    return Failure("bench chat: turns, system-tokens, question-words, reply-tokens, conversations, threads, timeout >= 1; "
                "warmup, llama-np, llama-ctx >= 0");
  }
  if (o.conversations > 256 || o.turns > 1000) return Failure("bench chat: at most 256 conversations and 1000 turns");
  if (o.label.empty()) o.label = "trellis";
  if (o.llama_template.empty() && !o.template_file.empty()) o.llama_template = o.template_file;
  if (o.llama_template.empty()) o.llama_template = std::string(TRELLIS_SOURCE_DIR) + "/tests/data/templates/TinyLlama-1.1B-Chat-v1.0.jinja";
  if (!o.llama_server.empty() && o.model.empty()) return Failure("bench chat: --llama-server needs the model file (-m)");
  ::mkdir(o.out_dir.c_str(), 0755);

  std::vector<ServerRun> runs;
  std::string system;
  json tools = json::array();
  int system_tokens = -1;
  // The system prompt (or, for agents, the tool definitions) is sized with the first
  // server's /tokenize and then used as it is for both: the same text, whatever each
  // server makes of it.
  auto calibrate = [&](const std::string& url) {
    if (!system.empty()) return;
    const Endpoint ep = ParseUrl(url);
    auto cli = MakeHttpClient(ep, o.timeout_s);
    if (o.tools <= 0) {
      system = CalibratedBookshopText(*cli, ep, o.system_tokens, system_tokens);
      return;
    }
    system = "You are the assistant of an online bookshop. Answer by calling the tools.";
    const int one = CountTokens(*cli, ep, MakeTools(1)[0].dump());
    const int n = std::clamp(one > 0 ? o.system_tokens / one : o.system_tokens / 120, 1, 128);
    tools = MakeTools(n);
    system_tokens = CountTokens(*cli, ep, tools.dump());
    std::fprintf(stderr, "bench agent: %d tools, %d tokens as JSON\n", n, system_tokens);
  };
  {
    ChildProcess trellis;
    std::string url = o.url;
    if (url.empty()) {
      auto addr = StartTrellis(trellis, o);
      if (!addr.ok()) return Failure(addr.status().ToString());
      url = *addr;
    }
    calibrate(url);
    std::fprintf(stderr, "bench chat: %s at %s, system prompt %d tokens\n", o.label.c_str(), url.c_str(), system_tokens);
    runs.push_back(RunWorkload(o, o.label, url, system, /*llama=*/false, tools));
  }  // stopped before llama-server starts: the two never share the cores
  // Agents against llama-server: llama.cpp 3f545be cannot force a call (tool_choice
  // "required" fails to build its sampler with Qwen's and Llama 3.1's templates), and a
  // call's first delta comes only once its name is written. So the run above (forced
  // calls) makes the trace, and both servers, trellis restarted cold, replay it: the same
  // histories with tool_choice "auto" and max_tokens 8, TTFT = prefill and the first token.
  ServerRun trace;
  if (!tools.empty() && !o.llama_server.empty() && o.url.empty()) {
    trace = std::move(runs.back());
    runs.pop_back();
    std::fprintf(stderr, "bench agent: the trace is made (forced calls); replaying it on a fresh trellis serve\n");
    ChildProcess trellis;
    auto addr = StartTrellis(trellis, o);
    if (!addr.ok()) return Failure(addr.status().ToString());
    runs.push_back(RunWorkload(o, o.label, *addr, system, /*llama=*/false, tools, &trace));
  }
  if (!o.llama_server.empty()) {
    ChildProcess llama;
    const std::vector<std::string> args = LlamaArgs(o);
    std::string shown;
    for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;
    std::fprintf(stderr, "bench chat: $ %s\n", shown.c_str());
    auto addr = llama.Start(o.llama_server, args, o.out_dir + "/llama-server.log", "llama-server");
    if (!addr.ok()) return Failure(addr.status().ToString());
    // /health is 200 once the model is loaded; the address is printed after that, but
    // a later llama-server may print it first.
    const Endpoint ep = ParseUrl(*addr);
    auto cli = MakeHttpClient(ep, 5);
    for (int i = 0; i < 600; ++i) {
      auto res = cli->Get(ep.prefix + "/health");
      if (res && res->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    calibrate(*addr);
    runs.push_back(RunWorkload(o, "llama-server", *addr, system, /*llama=*/true, tools,
                               trace.turns.empty() ? nullptr : &trace));
  }

  std::vector<std::vector<TurnStats>> stats;
  for (const ServerRun& r : runs) stats.push_back(PerTurn(o, r));
  std::vector<double> mean;
  for (const auto& s : stats) mean.push_back(MeanWarmTtft(s));
  const double ratio = runs.size() > 1 ? mean[0] / mean[1] : NAN;
  const std::string turns_label = o.turns > 1 ? "2.." + std::to_string(o.turns) : "1";
  std::string summary = "mean TTFT over turns " + turns_label + ":";
  for (size_t i = 0; i < runs.size(); ++i) summary += (i ? ", " : " ") + runs[i].label + " " + Num(mean[i], "%.1f") + " ms";
  if (runs.size() > 1) summary += "; " + runs[0].label + " / " + runs[1].label + " = " + Num(ratio, "%.2f");

  int errors = 0;
  for (const ServerRun& r : runs) errors += Errors(r);
  if (o.json) {
    json j = {{"turns", o.turns}, {"conversations", o.conversations}, {"system_tokens", system_tokens},
              {"question_words", o.question_words}, {"reply_tokens", o.reply_tokens}, {"seed", o.seed},
              {"servers", json::array()}, {"ttft_ratio", NumJson(ratio)}, {"errors", errors}};
    for (size_t i = 0; i < runs.size(); ++i) {
      json per = json::array();
      for (int t = 1; t <= o.turns; ++t) {
        const TurnStats& s = stats[i][static_cast<size_t>(t - 1)];
        per.push_back({{"turn", t}, {"ok", s.ok}, {"prompt_tokens", NumJson(s.prompt)}, {"cached_tokens", NumJson(s.cached)},
                       {"completion_tokens", NumJson(s.completion)}, {"ttft_ms", NumJson(s.ttft_ms)}});
      }
      j["servers"].push_back({{"label", runs[i].label}, {"url", runs[i].url}, {"per_turn", per},
                              {"mean_ttft_ms_warm", NumJson(mean[i])}, {"errors", Errors(runs[i])}});
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    const bool two = runs.size() > 1;
    const std::string a = runs[0].label, b = two ? runs[1].label : "llama-server";
    std::printf("| turn | prompt tokens | cached %s | cached %s | TTFT %s ms | TTFT %s ms |\n|---|---|---|---|---|---|\n",
                a.c_str(), b.c_str(), a.c_str(), b.c_str());
    for (int t = 1; t <= o.turns; ++t) {
      const TurnStats& x = stats[0][static_cast<size_t>(t - 1)];
      const TurnStats* y = two ? &stats[1][static_cast<size_t>(t - 1)] : nullptr;
      std::string prompt = Num(x.prompt, "%.1f");
      if (y && Num(y->prompt, "%.1f") != prompt) prompt += " / " + Num(y->prompt, "%.1f");
      std::printf("| %d | %s | %s | %s | %s | %s |\n", t, prompt.c_str(), Num(x.cached, "%.1f").c_str(),
                  y ? Num(y->cached, "%.1f").c_str() : "-", Num(x.ttft_ms).c_str(), y ? Num(y->ttft_ms).c_str() : "-");
    }
    std::printf("\n%s\n", summary.c_str());
    std::printf("system prompt %d tokens; %d conversation(s) x %d turns; %d-word questions; max_tokens %d; "
                "medians over conversations%s\n",
                system_tokens, o.conversations, o.turns, o.question_words, o.reply_tokens,
                runs.size() > 1 ? "; prompt tokens \"a / b\" where the servers differ" : "");
    for (size_t i = 0; i < runs.size(); ++i) {
      double lo = INFINITY, hi = -INFINITY;
      for (const TurnStats& s : stats[i]) {
        if (std::isnan(s.completion)) continue;
        lo = std::min(lo, s.completion);
        hi = std::max(hi, s.completion);
      }
      if (lo <= hi) std::printf("reply tokens per turn, %s: %s..%s\n", runs[i].label.c_str(), Num(lo, "%.1f").c_str(), Num(hi, "%.1f").c_str());
    }
    for (const ServerRun& r : runs) {
      int shown = 0;
      for (const TurnResult& t : r.turns) {
        if (t.error.empty() || shown++ >= 5) continue;
        std::printf("  error: %s conversation %d turn %d: %s\n", r.label.c_str(), t.conversation, t.turn, t.error.c_str());
      }
    }
  }
  std::fflush(stdout);
  if (Status s = WriteCsv(o, system_tokens, runs); !s.ok()) return Failure(s.ToString());
  WritePlot(o, system_tokens, runs, stats, summary);
  return errors == 0 ? Status::Ok() : Failure("bench chat: " + std::to_string(errors) + " turns failed");
}

}  // namespace trellis::bench
