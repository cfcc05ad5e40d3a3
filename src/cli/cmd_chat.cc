// trellis chat: an interactive chat in the terminal, the prefix cache made visible.
//
// Every turn renders the whole conversation with the model's chat template and submits it
// to the scheduler; the radix cache finds the previous turns' K/V, so a turn computes only
// the new text. After each reply one line reports the turn: prompt tokens, how many of them
// were reused from earlier turns, the time to the first token and the decode speed.
//
// Commands: /reset (forget the conversation, keep the system prompt), /system TEXT (set
// the system prompt; /system alone clears it), /stats (totals so far), /help, /exit.
// Ctrl-C while a reply streams stops it (the partial reply stays in the history);
// Ctrl-C at the prompt discards the line; Ctrl-D or /exit ends. With stdin not a terminal,
// lines are read from it (one message per line) and nothing is echoed.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/kv_flags.h"
#include "cli/line_editor.h"
#include "cli/template_flags.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "server/reasoning.h"
#include "util/clock.h"

namespace trellis::cli {
namespace {

struct ChatOpts {
  std::string model, chat_template, system;
  int threads = 0, ctx = 0, n_predict = 512;
  float temp = 0.7f, top_p = 0.95f, min_p = 0.05f;
  int top_k = 40;
  uint64_t seed = 0xC0FFEE;
  KvTypeFlags kv_types;
};

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void OnSigint(int) { g_interrupted = 1; }

// Bytes of s that end on a whole UTF-8 character (a reply streams token by token, and a
// token may end inside one).
size_t CompleteUtf8Prefix(const std::string& s) {
  size_t i = s.size();
  int cont = 0;
  while (i > 0 && cont < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i == 0) return s.size();  // no lead byte to wait on
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return s.size() - (i - 1) >= need ? s.size() : i - 1;
}

struct Totals {
  int turns = 0;
  int64_t prompt = 0, cached = 0, generated = 0;
  double ttft = 0, decode_seconds = 0;
};

class Chat {
 public:
  Chat(const ChatOpts& o, const Tokenizer& tok, const server::ChatTemplate& tmpl, Scheduler& sched)
      : o_(o), tok_(tok), tmpl_(tmpl), sched_(sched) {}

  int Run() {
    LineEditor editor;
    const bool tty = editor.interactive();
    for (;;) {
      auto line = editor.Read(tty ? "> " : "");
      if (!line) break;
      if (line->empty()) continue;
      if ((*line)[0] == '/') {
        if (!Command(*line)) break;
        continue;
      }
      Turn(*line, tty);
    }
    return 0;
  }

 private:
  // False to end.
  bool Command(const std::string& line) {
    const std::string cmd = line.substr(0, line.find(' '));
    const std::string arg = line.size() > cmd.size() ? line.substr(cmd.size() + 1) : "";
    if (cmd == "/exit" || cmd == "/quit") return false;
    if (cmd == "/reset") {
      history_.clear();
      Note("conversation cleared");
    } else if (cmd == "/system") {
      system_ = arg;
      Note(arg.empty() ? "system prompt cleared" : "system prompt set");
    } else if (cmd == "/stats") {
      const double hit = totals_.prompt ? 100.0 * static_cast<double>(totals_.cached) / static_cast<double>(totals_.prompt) : 0;
      Note(fmt::format("{} turns | prompt {} tokens, {} reused from the cache ({:.0f}%) | generated {} tokens at {:.1f} tok/s | "
                       "mean TTFT {:.0f} ms | history {} messages",
                       totals_.turns, totals_.prompt, totals_.cached, hit, totals_.generated,
                       totals_.decode_seconds > 0 ? static_cast<double>(totals_.generated) / totals_.decode_seconds : 0.0,
                       totals_.turns ? 1e3 * totals_.ttft / totals_.turns : 0.0, history_.size()));
    } else if (cmd == "/help") {
      Note("/reset  forget the conversation | /system TEXT  set the system prompt | /stats  totals | /exit");
    } else {
      Note(fmt::format("unknown command {} (/help lists them)", cmd));
    }
    return true;
  }

  static void Note(const std::string& s) {
    std::fprintf(stdout, "[%s]\n", s.c_str());
    std::fflush(stdout);
  }

  std::vector<server::ChatMessage> Messages() const {
    std::vector<server::ChatMessage> m;
    if (!system_.empty()) m.push_back({"system", system_});
    m.insert(m.end(), history_.begin(), history_.end());
    return m;
  }

  void Turn(const std::string& user, bool tty) {
    history_.push_back({"user", user});
    std::string prompt_text;
    auto ids = server::EncodeChat(tmpl_, tok_, Messages(), true, {}, &prompt_text);
    if (!ids.ok()) {
      history_.pop_back();
      Note(fmt::format("error: {}", ids.status().message()));
      return;
    }
    const int n_ctx = sched_.options().n_ctx;
    if (static_cast<int>(ids->size()) + 1 >= n_ctx) {
      history_.pop_back();
      Note(fmt::format("error: the conversation is {} tokens, the context {}: /reset to start over", ids->size(), n_ctx));
      return;
    }
    Request r;
    r.prompt = *ids;
    r.max_tokens = std::min(o_.n_predict, n_ctx - static_cast<int>(ids->size()));
    r.sampling.temperature = o_.temp;
    r.sampling.top_k = o_.top_k;
    r.sampling.top_p = o_.top_p;
    r.sampling.min_p = o_.min_p;
    r.sampling.seed = o_.seed + static_cast<uint64_t>(totals_.turns);
    const Tokenizer& tok = tok_;
    r.is_stop = [&tok](int32_t t) { return tok.IsEog(t); };

    std::vector<int32_t> out;
    size_t printed = 0;
    std::string text;
    // A thinking model's reasoning is shown apart from its answer (dimmed on a terminal,
    // between [thinking] and [answer] lines otherwise) and kept out of the history.
    server::ReasoningSplitter split(tmpl_.thinks(),
                                    tmpl_.thinks() && server::ReasoningSplitter::PromptOpensReasoning(prompt_text));
    std::string answer;
    bool in_reasoning = false;
    auto show = [&](const server::ReasoningSplitter::Parts& p) {
      if (!p.reasoning.empty()) {
        if (!in_reasoning) std::fputs(tty ? "\x1b[2m" : "[thinking]\n", stdout);
        in_reasoning = true;
        std::fwrite(p.reasoning.data(), 1, p.reasoning.size(), stdout);
      }
      if (!p.content.empty()) {
        if (in_reasoning) std::fputs(tty ? "\x1b[0m\n" : "\n[answer]\n", stdout);
        in_reasoning = false;
        std::fwrite(p.content.data(), 1, p.content.size(), stdout);
        answer += p.content;
      }
      std::fflush(stdout);
    };
    RequestResult result;
    bool done = false;
    const double t0 = NowSeconds();
    double t_first = 0;
    auto on_token = [&](RequestId, int32_t t, std::span<const float>) {
      if (tok.IsEog(t)) return;
      if (out.empty()) t_first = NowSeconds();
      out.push_back(t);
      text = tok.Decode(out);
      const size_t upto = CompleteUtf8Prefix(text);
      if (upto > printed) {
        show(split.Feed(std::string_view(text).substr(printed, upto - printed)));
        printed = upto;
      }
    };
    auto on_finish = [&](RequestId, const RequestResult& rr) {
      result = rr;
      done = true;
    };
    auto id = sched_.Submit(r, on_token, on_finish);
    if (!id.ok()) {
      history_.pop_back();
      Note(fmt::format("error: {}", id.status().message()));
      return;
    }
    g_interrupted = 0;
    struct sigaction sa{}, old{};
    sa.sa_handler = OnSigint;
    sigaction(SIGINT, &sa, &old);
    bool stopped = false;
    while (!done) {
      if (g_interrupted && !stopped) {
        sched_.Cancel(*id);
        stopped = true;
      }
      sched_.Step();
    }
    sigaction(SIGINT, &old, nullptr);
    if (printed < text.size()) show(split.Feed(std::string_view(text).substr(printed)));
    show(split.Flush());
    if (in_reasoning && tty) std::fputs("\x1b[0m", stdout);
    std::fputc('\n', stdout);
    if (result.reason == FinishReason::kError) {
      history_.pop_back();
      Note(fmt::format("error: {}", result.error.message()));
      return;
    }
    history_.push_back({"assistant", answer});
    const double end = NowSeconds();
    const double ttft = out.empty() ? end - t0 : t_first - t0;
    const double decode = out.size() > 1 ? end - t_first : 0;
    totals_.turns += 1;
    totals_.prompt += result.n_prompt;
    totals_.cached += result.n_cached;
    totals_.generated += static_cast<int64_t>(out.size());
    totals_.ttft += ttft;
    totals_.decode_seconds += decode;
    const std::string line =
        fmt::format("prompt {} tokens, {} reused from earlier turns, {} computed | TTFT {:.0f} ms | {} tokens{}{}",
                    result.n_prompt, result.n_cached, result.n_prompt - result.n_cached, ttft * 1e3, out.size(),
                    decode > 0 ? fmt::format(" at {:.1f} tok/s", static_cast<double>(out.size() - 1) / decode) : "",
                    stopped ? " (stopped)" : result.reason == FinishReason::kLength ? " (length limit)" : "");
    if (tty) {
      std::fprintf(stdout, "\x1b[2m[%s]\x1b[0m\n", line.c_str());
    } else {
      std::fprintf(stdout, "[%s]\n", line.c_str());
    }
    std::fflush(stdout);
  }

  const ChatOpts& o_;
  const Tokenizer& tok_;
  const server::ChatTemplate& tmpl_;
  Scheduler& sched_;
  std::string system_ = o_.system;
  std::vector<server::ChatMessage> history_;
  Totals totals_;
};

}  // namespace

Runner AddChatCommand(CLI::App& app) {
  auto o = std::make_shared<ChatOpts>();
  app.add_option("-m,--model", o->model, "GGUF model file")->required();
  app.add_option("--chat-template", o->chat_template,
                 "a built-in template (" + server::ChatTemplate::KnownNames() + ") or a Jinja file (default: the model's own)");
  app.add_option("--system", o->system, "system prompt (also: /system TEXT)");
  app.add_option("-n,--n-predict", o->n_predict, "most tokens per reply")->capture_default_str();
  app.add_option("-c,--ctx-size", o->ctx, "context per conversation (default: the model's, at most 4096)");
  AddKvTypeFlags(app, &o->kv_types);
  app.add_option("-t,--threads", o->threads, kThreadsHelp);
  app.add_option("--temp", o->temp, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", o->top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", o->top_p, "top-p")->capture_default_str();
  app.add_option("--min-p", o->min_p, "min-p")->capture_default_str();
  app.add_option("--seed", o->seed, "sampling seed")->capture_default_str();
  return [o] {
    if (o->n_predict < 1) return Fail("--n-predict must be >= 1");
    if (!(o->temp >= 0 && o->temp <= 2)) return Fail("--temp must be in [0, 2]");
    auto model = Model::Load(o->model);
    if (!model.ok()) return Fail(model.status().ToString());
    auto tok = Tokenizer::FromGguf((*model)->gguf());
    if (!tok.ok()) return Fail(tok.status().ToString());
    std::string source;
    auto tmpl = PickTemplate(o->chat_template, **model, **tok, source);
    if (!tmpl.ok()) return Fail(tmpl.status().message());
    std::string how;
    const int threads = ResolveThreads(o->threads, &how);
    ThreadPool pool(threads);
    SchedulerOptions so;
    so.n_ctx = o->ctx;
    so.max_running = 1;
    so.kv_type_k = o->kv_types.K();
    so.kv_type_v = o->kv_types.V();
    auto sched = Scheduler::Create(**model, so, pool);
    if (!sched.ok()) return Fail(sched.status().ToString());
    const ModelConfig& c = (*model)->config();
    std::fprintf(stdout, "trellis chat: %s (%s, %s) | template %s (%s) | ctx %d | %s | /help for commands\n",
                 std::filesystem::path(o->model).filename().c_str(), c.arch.c_str(), (*model)->TypeSummary().c_str(),
                 std::string(tmpl->name()).c_str(), source.c_str(), (*sched)->options().n_ctx,
                 ThreadsText(threads, how).c_str());
    std::fflush(stdout);
    Chat chat(*o, **tok, *tmpl, **sched);
    return chat.Run();
  };
}

}  // namespace trellis::cli
