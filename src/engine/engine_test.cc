// Engine invariants: results do not depend on how the KV cache is paged, how the
// prompt is chunked, or which other sequences share a batch; bad requests and a full pool
// are clear errors that leak nothing. Sessions run on the Scheduler (RunOne), batches
// straight through Forward.
#include "engine/kv_layout.h"
#include "engine/forward.h"
#include "engine/run_one.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "engine/test_models.h"
#include "util/clock.h"
#include "util/fault_env.h"
#include "util/slowdown.h"

namespace trellis {
namespace {

constexpr size_t kVocab = 1024;  // the small test models' vocabulary

// Worst over rows of rms(a - b) / std(b), the measure the reference test uses; +inf if
// any row holds a NaN or an Inf, or the sizes differ.
double RelDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size() || b.empty() || b.size() % kVocab != 0) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t r = 0; r < b.size(); r += kVocab) worst = testing::Worse(worst, testing::RmsOverStd(&a[r], &b[r], kVocab));
  return worst;
}

// A NaN or an Inf anywhere fails a comparison, in any row; std::max(worst, NaN) used to
// keep `worst` and pass NaN logits.
TEST(RmsOverStdTest, NanAndInfRowsFail) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> ref(3 * kVocab);
  for (float& x : ref) x = d(rng);
  std::vector<float> ours = ref;
  EXPECT_EQ(RelDiff(ours, ref), 0.0);
  EXPECT_EQ(testing::RmsOverStd(ours.data(), ref.data(), kVocab), 0.0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    ours = ref;
    ours[kVocab + 5] = bad;  // a middle row: an earlier, finite row sets `worst` first
    EXPECT_FALSE(testing::RmsOverStd(&ours[kVocab], &ref[kVocab], kVocab) < 1.0);
    EXPECT_FALSE(RelDiff(ours, ref) < 1.0);
    ours = ref;
    std::vector<float> bad_ref = ref;
    bad_ref[2 * kVocab] = bad;  // the reference side too
    EXPECT_FALSE(testing::RmsOverStd(&ours[2 * kVocab], &bad_ref[2 * kVocab], kVocab) < 1.0);
    EXPECT_FALSE(RelDiff(ours, bad_ref) < 1.0);
  }
  // A whole row of NaN (a forward pass that produced nothing but NaN) and one of Inf.
  ours = ref;
  std::fill(ours.begin() + kVocab, ours.begin() + 2 * kVocab, std::numeric_limits<float>::quiet_NaN());
  EXPECT_FALSE(RelDiff(ours, ref) < 1.0);
  ours = ref;
  std::fill(ours.begin(), ours.begin() + kVocab, std::numeric_limits<float>::infinity());
  EXPECT_FALSE(RelDiff(ours, ref) < 1.0);
  // A constant reference row has no spread to measure against.
  std::vector<float> flat(kVocab, 2.f);
  EXPECT_FALSE(testing::RmsOverStd(flat.data(), flat.data(), kVocab) < 1.0);
  // The running worst keeps a NaN wherever it comes.
  double worst = 0;
  for (double x : {0.1, std::numeric_limits<double>::quiet_NaN(), 0.05}) worst = testing::Worse(worst, x);
  EXPECT_FALSE(worst < 1.0);
  EXPECT_EQ(std::max(0.1, std::numeric_limits<double>::quiet_NaN()), 0.1);  // the trap Worse avoids
}

// Bound on RelDiff between two runs that differ only in float summation order. With
// f32 weights that is rounding (~1e-6). Quantized weight types quantize activations to
// 8 bits per block, so a last-bit difference can flip one rounding and propagate:
// llama.cpp disagrees with itself across batch sizes by ~0.03 on its own reference
// models for the same reason (tests/data/README.md). A real bug gives ~1.
double InvarianceBound(const std::string& type) { return type == "f32" ? 1e-4 : 0.03; }

class EngineInvariance : public ::testing::TestWithParam<std::string> {};

// Block size and prefill chunk size only change the order of floating-point sums (in
// attention's online softmax and in the batched matmul tiles), so logits agree to float
// rounding: bound 1e-4 of the logits' spread, ~100x below any real bug.
TEST_P(EngineInvariance, PagingAndChunkingDoNotChangeResults) {
  auto m = Model::Load(testing::WriteSmallModel("inv_" + GetParam() + ".gguf", GetParam()));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(150);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000) + 3;

  Request req;
  req.prompt = prompt;
  req.max_tokens = 12;
  req.prompt_logits = true;
  req.sampling.temperature = 0;
  std::vector<float> base_logits;
  std::vector<int32_t> base_tokens;
  double worst = 0;
  // Emulated (TestEmulated): the first case (the baseline) and two more, across both axes.
  const std::vector<std::pair<int, int>> grid = [] {
    std::vector<std::pair<int, int>> g;
    for (int bs : {32, 8, 16, 64, 128}) {
      for (int chunk : {512, 1, 7, 64}) g.emplace_back(bs, chunk);
    }
    if (TestEmulated()) g = {{32, 512}, {8, 1}, {64, 7}};
    return g;
  }();
  for (const auto& [bs, chunk] : grid) {
    {
      ThreadPool pool(2);
      SchedulerOptions so;
      so.block_size = bs;
      so.max_batch_tokens = chunk;
      so.prefill_chunk = chunk;
      so.prefix_cache = false;  // every block goes back to the pool at the end
      so.prompt_logits = true;
      auto s = Scheduler::Create(**m, so, pool);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      auto run = RunOne(**s, req);
      ASSERT_TRUE(run.ok()) << run.status().ToString();
      const RequestResult& r = run->result;
      EXPECT_EQ((*s)->pool().n_used(), 0) << "blocks leaked";
      if (base_logits.empty()) {
        base_logits = r.prompt_logits;
        base_tokens = r.tokens;
        continue;
      }
      ASSERT_EQ(r.prompt_logits.size(), base_logits.size());
      const double d = RelDiff(r.prompt_logits, base_logits);
      EXPECT_LT(d, InvarianceBound(GetParam())) << "block " << bs << " chunk " << chunk;
      worst = testing::Worse(worst, d);
      if (GetParam() == "f32") {
        EXPECT_EQ(r.tokens, base_tokens) << "block " << bs << " chunk " << chunk;
      }
    }
  }
  std::printf("[invariance] %s: worst rms/std across block and chunk sizes %.2e\n", GetParam().c_str(), worst);
}

// Sequences batched together give the same logits as each run alone.
TEST_P(EngineInvariance, BatchMixDoesNotChangeResults) {
  auto m = Model::Load(testing::WriteSmallModel("mix_" + GetParam() + ".gguf", GetParam()));
  ASSERT_TRUE(m.ok());
  ThreadPool threads(2);
  auto pool = BlockPool::Create(KvLayoutFor((*m)->config(), 32), 64);
  ASSERT_TRUE(pool.ok());
  // Logit rows for up to max_batch_tokens rows per step.
  Forward fwd(**m, (*pool)->view(), 256, 256, threads, (*m)->config().DefaultContext());
  struct {
    BlockPool& p;
    Forward& f;
    BlockPool& pool() { return p; }
    Forward& forward() { return f; }
  } en{**pool, fwd};
  std::mt19937 rng(5);
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> table;
    int32_t pos0;
  };
  // Three sequences at different stages: a fresh prefill, a continued prefill over an
  // existing prefix, and a decode step.
  std::vector<Seq> seqs(3);
  const int prefix_len[] = {0, 40, 77};
  const int run_len[] = {33, 20, 1};
  for (int s = 0; s < 3; ++s) {
    for (int b = 0; b < 4; ++b) seqs[s].table.push_back(en.pool().Allocate());
    std::shuffle(seqs[s].table.begin(), seqs[s].table.end(), rng);
    std::vector<int32_t> prefix(static_cast<size_t>(prefix_len[s]));
    for (auto& t : prefix) t = static_cast<int32_t>(rng() % 1000) + 3;
    if (!prefix.empty()) {
      SeqBatch sb{prefix, 0, seqs[s].table, 0};
      Status st = en.forward().Run({&sb, 1});
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    seqs[s].pos0 = prefix_len[s];
    seqs[s].tokens.resize(static_cast<size_t>(run_len[s]));
    for (auto& t : seqs[s].tokens) t = static_cast<int32_t>(rng() % 1000) + 3;
  }
  // Alone (the KV written for the run positions is overwritten identically next time).
  std::vector<std::vector<float>> alone(3);
  for (int s = 0; s < 3; ++s) {
    SeqBatch sb{seqs[s].tokens, seqs[s].pos0, seqs[s].table, 2};
    if (run_len[s] < 2) sb.n_logits = 1;
    Status st = en.forward().Run({&sb, 1});
    ASSERT_TRUE(st.ok()) << st.ToString();
    alone[s].assign(en.forward().logits().begin(), en.forward().logits().end());
  }
  std::vector<SeqBatch> batch;
  for (int s = 0; s < 3; ++s) batch.push_back(SeqBatch{seqs[s].tokens, seqs[s].pos0, seqs[s].table, run_len[s] < 2 ? 1 : 2});
  Status st = en.forward().Run(batch);
  ASSERT_TRUE(st.ok()) << st.ToString();
  size_t off = 0;
  for (int s = 0; s < 3; ++s) {
    std::span<const float> together = en.forward().logits().subspan(off, alone[s].size());
    EXPECT_LT(RelDiff(together, alone[s]), InvarianceBound(GetParam())) << "sequence " << s;
    off += alone[s].size();
  }
  EXPECT_EQ(off, en.forward().logits().size());
}

INSTANTIATE_TEST_SUITE_P(Types, EngineInvariance, ::testing::Values("f32", "q4_0", "q4_k_m", "q5_k_m"));

// A profiled pass (bench speed --budget) gives the same logits as an unprofiled one,
// counts its passes, tokens and layers, and each phase's work exactly: the products'
// multiply-adds and weight bytes, attention's 4 x q width x context FLOPs; its phases add
// up to no more than the wall time around the pass.
TEST(EngineTest, AProfiledPassCountsEveryPhaseAndChangesNothing) {
  auto m = Model::Load(testing::WriteSmallModel("profile_q4_0.gguf", "q4_0"));
  ASSERT_TRUE(m.ok());
  const ModelConfig& c = (*m)->config();
  ThreadPool threads(2);
  auto pool = BlockPool::Create(KvLayoutFor(c, 32), 16);
  ASSERT_TRUE(pool.ok());
  Forward fwd(**m, (*pool)->view(), 64, 64, threads, c.DefaultContext());
  std::vector<int32_t> table;
  for (int b = 0; b < 4; ++b) table.push_back((*pool)->Allocate());
  std::vector<int32_t> prompt(40), step(1, 7);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + 17 * i % 1000);
  // Unprofiled, then profiled: a prompt of 40 and one decode step after it.
  auto run = [&](std::vector<float>* out) {
    SeqBatch a{prompt, 0, table, 1};
    ASSERT_TRUE(fwd.Run({&a, 1}).ok());
    out->assign(fwd.logits().begin(), fwd.logits().end());
    SeqBatch b{step, 40, table, 1};
    ASSERT_TRUE(fwd.Run({&b, 1}).ok());
    out->insert(out->end(), fwd.logits().begin(), fwd.logits().end());
  };
  std::vector<float> plain, profiled;
  run(&plain);
  ForwardProfile prof;
  fwd.set_profile(&prof);
  const int64_t t0 = NowNanos();
  run(&profiled);
  const int64_t wall = NowNanos() - t0;
  fwd.set_profile(nullptr);
  EXPECT_EQ(plain, profiled);

  const double L = c.n_layer, E = c.n_embd, QD = static_cast<double>(c.n_head) * c.head_dim, KD = static_cast<double>(c.kv_dim()),
               F = c.n_ff;
  EXPECT_EQ(prof.passes, 2);
  EXPECT_EQ(prof.tokens, 41);
  EXPECT_EQ(prof.layer_passes, 2 * c.n_layer);
  using P = ForwardProfile;
  EXPECT_EQ(prof.phase[P::kQkv].macs, 41 * L * E * (QD + 2 * KD));
  EXPECT_EQ(prof.phase[P::kOut].macs, 41 * L * QD * E);
  EXPECT_EQ(prof.phase[P::kFfnIn].macs, 41 * L * 2 * E * F);
  EXPECT_EQ(prof.phase[P::kFfnDown].macs, 41 * L * F * E);
  EXPECT_EQ(prof.phase[P::kLogits].macs, 2 * E * double(c.n_vocab));  // one logit row per pass
  const WeightMatrix& wq = (*m)->layer(0).wq;
  EXPECT_GT(prof.phase[P::kQkv].weight_bytes, 2 * L * static_cast<double>(wq.rows * wq.row_bytes));
  // Context summed over the query rows: 1 + 2 + ... + 40 for the prompt, 41 for the step.
  EXPECT_EQ(prof.phase[P::kAttention].flops, L * 4 * QD * (40 * 41 / 2 + 41));
  for (int i = 0; i < P::kPhases; ++i) {
    if (i == P::kRouting) {
      EXPECT_EQ(prof.phase[static_cast<size_t>(i)].ns, 0) << "a dense model has no routing";
      continue;
    }
    EXPECT_GT(prof.phase[static_cast<size_t>(i)].ns, 0) << P::Name(i);
  }
  for (int i : {P::kQkv, P::kOut, P::kFfnIn, P::kFfnDown, P::kLogits}) {
    const P::Counts& k = prof.phase[static_cast<size_t>(i)];
    EXPECT_GT(k.act_ns, 0) << P::Name(i);
    EXPECT_LT(k.act_ns, k.ns) << P::Name(i);
  }
  // No lower bound against the wall: what lies outside the phases (the scheduler,
  // sampling) stretches with a loaded host (367 of 816 us once in CI); each phase's own
  // time is checked above.
  EXPECT_LE(prof.TotalNs(), wall);
}

TEST(EngineTest, BadRequestsAreRefusedAndLeakNothing) {
  auto m = Model::Load(testing::WriteSmallModel("bad.gguf"));
  ASSERT_TRUE(m.ok());
  ThreadPool pool(2);
  auto e = Scheduler::Create(**m, SchedulerOptions{.n_ctx = 64, .prefix_cache = false}, pool);
  ASSERT_TRUE(e.ok());
  Request r;
  r.sampling.temperature = 0;
  EXPECT_EQ(RunOne(**e, r).status().code(), StatusCode::kInvalidArgument);  // empty
  r.prompt = {1, 2, 5000};
  EXPECT_EQ(RunOne(**e, r).status().code(), StatusCode::kInvalidArgument);  // out of vocab
  r.prompt.assign(80, 7);
  auto long_prompt = RunOne(**e, r);
  EXPECT_EQ(long_prompt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(long_prompt.status().message().find("context"), std::string::npos);
  r.prompt = {1, 2, 3};
  r.max_tokens = 200;
  auto full = RunOne(**e, r);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->result.reason, FinishReason::kContextFull);
  EXPECT_LE(full->result.n_prompt + static_cast<int>(full->result.tokens.size()), 65);
  EXPECT_EQ((*e)->pool().n_used(), 0);
}

// Each refusal names its reason: the server maps them onto OpenAI's errors (a prompt or
// max_tokens over the context is context_length_exceeded, the param says which).
TEST(EngineTest, RefusalsSayWhy) {
  auto m = Model::Load(testing::WriteSmallModel("why.gguf"));
  ASSERT_TRUE(m.ok());
  ThreadPool pool(2);
  auto e = Scheduler::Create(**m, SchedulerOptions{.block_size = 16, .kv_blocks = 3, .n_ctx = 64, .prefix_cache = false}, pool);
  ASSERT_TRUE(e.ok());
  auto why = [&](const Request& r) { return (*e)->Check(r).refusal; };
  Request r;
  EXPECT_EQ(why(r), Refusal::kEmptyPrompt);
  r.prompt = {1, 2, 3};
  EXPECT_EQ(why(r), Refusal::kNone);
  EXPECT_TRUE((*e)->Check(r).status.ok());
  r.prompt.assign(64, 7);
  EXPECT_EQ(why(r), Refusal::kPromptOverContext);
  r.prompt.assign(48, 7);  // 48 positions and the first token: 4 blocks of 16, the pool has 3
  EXPECT_EQ(why(r), Refusal::kPromptOverPool);
  EXPECT_EQ((*e)->Check(r).status.code(), StatusCode::kResourceExhausted);
  r.prompt = {1, 2, 3, 5000};
  EXPECT_EQ(why(r), Refusal::kTokenOutsideVocabulary);
  r.prompt = {1, 2, 3};
  r.max_tokens = 62;
  EXPECT_EQ(why(r), Refusal::kNone);  // stops at the context's end
  r.max_tokens_must_fit = true;
  EXPECT_EQ(why(r), Refusal::kMaxTokensOverContext);
  r.max_tokens = 61;
  EXPECT_EQ(why(r), Refusal::kNone);  // 3 + 61 = 64 fits
  r.max_tokens = -1;
  EXPECT_EQ(why(r), Refusal::kBadParameter);
  r.max_tokens = 4;
  r.sampling.top_p = 2;
  EXPECT_EQ(why(r), Refusal::kBadParameter);
}

// The seams of util/env.h: a model file whose map fails is a clear error (and the next
// load works); request times are read from the scheduler's Env, so a test moves them.
TEST(EngineTest, TheEnvMapsTheModelAndKeepsTheTime) {
  const std::string path = testing::WriteSmallModel("env.gguf");
  FaultEnv env;
  env.fail_maps = true;
  auto bad = Model::Load(path, {}, &env);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kIoError);
  EXPECT_NE(bad.status().message().find("injected"), std::string::npos);
  EXPECT_EQ(env.injected.load(), 1u);
  env.fail_maps = false;
  auto m = Model::Load(path, {}, &env);
  ASSERT_TRUE(m.ok()) << m.status().ToString();

  env.fake_now = int64_t{100} * 1000000000;
  ThreadPool pool(2);
  auto s = Scheduler::Create(**m, SchedulerOptions{.n_ctx = 64, .prefix_cache = false, .env = &env}, pool);
  ASSERT_TRUE(s.ok());
  Request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 4;
  r.sampling.temperature = 0;
  RequestResult got;
  ASSERT_TRUE((*s)->Submit(r, nullptr, [&](RequestId, const RequestResult& x) { got = x; }).ok());
  env.Advance(int64_t{3} * 1000000000);  // 3 s pass before the first step
  (*s)->RunUntilIdle();
  EXPECT_EQ(got.tokens.size(), 4u);
  EXPECT_NEAR(got.ttft_seconds, 3.0, 1e-6);  // the real clock would give ~0
  EXPECT_NEAR(got.total_seconds, 3.0, 1e-6);
}

TEST(EngineTest, FullPoolIsResourceExhaustedNotACrash) {
  auto m = Model::Load(testing::WriteSmallModel("pool.gguf"));
  ASSERT_TRUE(m.ok());
  ThreadPool pool(2);
  auto e = Scheduler::Create(**m, SchedulerOptions{.kv_blocks = 2, .n_ctx = 512, .prefix_cache = false}, pool);  // 64 positions
  ASSERT_TRUE(e.ok());
  Request r;
  r.prompt.assign(100, 9);
  r.sampling.temperature = 0;
  auto res = RunOne(**e, r);
  EXPECT_EQ(res.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*e)->pool().n_used(), 0);
  r.prompt.assign(10, 9);
  r.max_tokens = 4;
  EXPECT_TRUE(RunOne(**e, r).ok());  // the pool is usable afterwards
}

TEST(EngineTest, BadOptionsAreRefused) {
  auto m = Model::Load(testing::WriteSmallModel("opts.gguf"));
  ASSERT_TRUE(m.ok());
  ThreadPool pool(2);
  EXPECT_FALSE(Scheduler::Create(**m, SchedulerOptions{.block_size = 0}, pool).ok());
  EXPECT_FALSE(Scheduler::Create(**m, SchedulerOptions{.block_size = 5000}, pool).ok());
  EXPECT_TRUE(Scheduler::Create(**m, SchedulerOptions{.block_size = 7}, pool).ok());  // 7 x 64 dims: aligned
  EXPECT_FALSE(Scheduler::Create(**m, SchedulerOptions{.kv_memory_bytes = 1000}, pool).ok());
  EXPECT_FALSE(Scheduler::Create(**m, SchedulerOptions{.max_batch_tokens = 0}, pool).ok());
}

}  // namespace
}  // namespace trellis
