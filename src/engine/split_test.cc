// A model split into parts (ModelPart) and run as a pipeline of stages gives the same
// tokens and logits as the whole model in one Forward. SplitExecutor here is the grid's
// head and nodes without the network: each stage has its own part of the model and its
// own pool holding its layers of every block; batches are launched into a queue and run
// through the later stages only when collected, several in flight, so the scheduler's
// pipelining (micro-batches, prefill chunks following each other, copy-on-write ordered
// before later batches) is checked against the whole model.
#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "engine/kv_layout.h"
#include "engine/scheduler.h"
#include "engine/test_models.h"
#include "engine/test_scheduler.h"

namespace trellis {
namespace {

using testing::Greedy;
using testing::Outcome;
using testing::RunAll;

const std::string& SmallModelPath() {
  static const std::string p = testing::WriteSmallModel("split_q4_0.gguf", "q4_0");
  return p;
}

std::unique_ptr<Model> LoadPart(const ModelPart& part) {
  auto r = Model::Load(SmallModelPath(), part);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(ModelPartTest, KeepsItsLayersAndTheWholeFingerprint) {
  auto whole = LoadPart({});
  auto head = LoadPart({.first_layer = 0, .last_layer = 1, .embed = true, .head = true});
  auto node = LoadPart({.first_layer = 1, .last_layer = -1, .embed = false, .head = false});
  ASSERT_TRUE(whole && head && node);
  EXPECT_TRUE(whole->whole());
  EXPECT_FALSE(head->whole());
  EXPECT_EQ(head->fingerprint(), whole->fingerprint());
  EXPECT_EQ(node->fingerprint(), whole->fingerprint());
  EXPECT_EQ(node->part().last_layer, 2);
  EXPECT_TRUE(node->has_layer(1));
  EXPECT_FALSE(node->has_layer(0));
  EXPECT_EQ(node->layer(0).wq.data, nullptr);
  EXPECT_NE(node->layer(1).wq.data, nullptr);
  EXPECT_EQ(node->n_local_layers(), 1);
  // The parts' weights add up to the whole's.
  EXPECT_EQ(head->WeightBytes() + node->WeightBytes(), whole->WeightBytes());
  EXPECT_EQ(head->ActiveMacsPerToken() + node->ActiveMacsPerToken(), whole->ActiveMacsPerToken());
  const ModelConfig& c = whole->config();
  const int64_t E = c.n_embd, Q = static_cast<int64_t>(c.n_head) * c.head_dim,
                KV = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  EXPECT_EQ(whole->ActiveMacsPerToken(), c.n_layer * (2 * E * Q + 2 * E * KV + 3 * E * c.n_ff) + E * c.n_vocab);
}

TEST(ModelPartTest, RangesOutsideTheModelAreRefused) {
  for (ModelPart p : {ModelPart{.first_layer = 0, .last_layer = 3}, ModelPart{.first_layer = 2, .last_layer = 1},
                      ModelPart{.first_layer = -1, .last_layer = 1}}) {
    auto r = Model::Load(SmallModelPath(), p);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("layer range"), std::string::npos) << r.status().ToString();
  }
}

// The head stage lives in the scheduler's pool; each later stage has its own.
class SplitExecutor final : public StepExecutor {
 public:
  struct Stage {
    std::unique_ptr<BlockPool> pool;
    std::unique_ptr<Forward> forward;
  };

  SplitExecutor(const Model& head, std::vector<const Model*> nodes, const PagedKv& kv, int32_t n_blocks, int max_tokens,
                int max_logits, ThreadPool& threads, int depth)
      : depth_(depth), head_(head, kv, max_tokens, max_logits, threads) {
    for (const Model* m : nodes) {
      Stage st;
      auto p = BlockPool::Create(LocalKvLayoutFor(*m, kv.layout.block_size), n_blocks);
      EXPECT_TRUE(p.ok());
      st.pool = std::move(p).value();
      st.forward = std::make_unique<Forward>(*m, st.pool->view(), max_tokens, max_logits, threads);
      stages_.push_back(std::move(st));
    }
  }

  int depth() const override { return depth_; }

  Status Launch(std::span<const SeqBatch> seqs) override {
    TRELLIS_RETURN_IF_ERROR(head_.Prepare(seqs));
    head_.RunLayers();
    Batch b;
    b.copies = std::move(copies_);
    copies_.clear();
    b.hidden.assign(head_.hidden(), head_.hidden() + static_cast<size_t>(head_.hidden_rows()) * E());
    for (const SeqBatch& s : seqs) {
      b.tables.emplace_back(s.block_table.begin(), s.block_table.end());
      b.pos0.push_back(s.pos0);
      b.n_tokens.push_back(static_cast<int32_t>(s.tokens.size()));
      b.n_logits.push_back(s.n_logits);
    }
    queue_.push_back(std::move(b));
    ++launched_;
    return Status::Ok();
  }

  Status Collect() override {
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    for (Stage& st : stages_) {
      for (const auto& c : b.copies) st.pool->CopySlots(c[0], c[1], c[2]);
      std::vector<SeqBatch> seqs(b.tables.size());
      std::vector<std::vector<int32_t>> dummy(b.tables.size());
      for (size_t i = 0; i < seqs.size(); ++i) {
        dummy[i].assign(static_cast<size_t>(b.n_tokens[i]), 0);
        seqs[i] = SeqBatch{dummy[i], b.pos0[i], b.tables[i], b.n_logits[i]};
      }
      TRELLIS_RETURN_IF_ERROR(st.forward->Prepare(seqs, b.hidden.data()));
      st.forward->RunLayers();
      std::copy_n(st.forward->hidden(), b.hidden.size(), b.hidden.data());
    }
    max_in_flight_ = std::max(max_in_flight_, static_cast<int>(queue_.size()) + 1);
    return head_.ComputeLogits(b.n_tokens, b.n_logits, b.hidden.data());
  }

  const float* logits_row(int i) const override { return head_.logits_row(i); }

  void CopySlots(BlockPool& pool, int32_t src, int32_t dst, int32_t n) override {
    pool.CopySlots(src, dst, n);
    copies_.push_back({src, dst, n});
  }

  int max_in_flight() const { return max_in_flight_; }
  int64_t launched() const { return launched_; }

 private:
  struct Batch {
    std::vector<std::array<int32_t, 3>> copies;  // applied by every later stage first
    std::vector<float> hidden;
    std::vector<std::vector<int32_t>> tables;
    std::vector<int32_t> pos0, n_tokens, n_logits;
  };
  int64_t E() const { return head_.model().config().n_embd; }

  int depth_;
  Forward head_;
  std::vector<Stage> stages_;
  std::deque<Batch> queue_;
  std::vector<std::array<int32_t, 3>> copies_;
  int max_in_flight_ = 0;
  int64_t launched_ = 0;
};

struct SplitCase {
  int head_layers;  // layers the head runs: 0 or 1 of the small model's 2
  int depth;
};

class SplitSchedulerTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitSchedulerTest, PipelinedSplitEqualsWholeModel) {
  const SplitCase sc = GetParam();
  auto whole = LoadPart({});
  auto head = LoadPart({.first_layer = 0, .last_layer = sc.head_layers, .embed = true, .head = true});
  std::vector<std::unique_ptr<Model>> parts;
  for (int l = sc.head_layers; l < 2; ++l) parts.push_back(LoadPart({.first_layer = l, .last_layer = l + 1, .embed = false, .head = false}));
  ASSERT_TRUE(whole && head);
  std::vector<const Model*> node_models;
  for (auto& p : parts) node_models.push_back(p.get());

  ThreadPool threads(2);
  SchedulerOptions o;
  o.block_size = 8;
  o.kv_blocks = 18;  // tight: preemption and eviction happen
  o.n_ctx = 128;
  o.prefill_chunk = 12;
  SplitExecutor* exec = nullptr;
  SchedulerOptions so = o;
  so.executor = [&](const PagedKv& kv, int32_t n_blocks, int max_tokens, int max_logits, ThreadPool& tp)
      -> Result<std::unique_ptr<StepExecutor>> {
    auto e = std::make_unique<SplitExecutor>(*head, node_models, kv, n_blocks, max_tokens, max_logits, tp, sc.depth);
    exec = e.get();
    return std::unique_ptr<StepExecutor>(std::move(e));
  };
  auto split = Scheduler::Create(*head, so, threads);
  ASSERT_TRUE(split.ok()) << split.status().ToString();

  // Concurrent requests sharing prefixes (whole blocks and parts of blocks), then a
  // second wave that reuses what the first cached, partial copies included.
  std::mt19937 rng(11);
  std::vector<int32_t> shared(29);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 1000) + 3;
  auto make_wave = [&](int n, int salt) {
    std::vector<Request> reqs;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> p(shared.begin(), shared.begin() + 10 + 4 * i);
      for (int k = 0; k < 3 + i; ++k) p.push_back(static_cast<int32_t>((salt * 31 + i * 7 + k) % 1000) + 3);
      reqs.push_back(Greedy(p, 12 + i));
    }
    return reqs;
  };
  SchedulerOptions local_o = o;
  local_o.kv_blocks = 256;  // no pressure: the reference
  for (int wave = 0; wave < 2; ++wave) {
    const std::vector<Request> reqs = make_wave(5, wave);
    auto got = RunAll(**split, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto ref_s = Scheduler::Create(*whole, local_o, threads);
      ASSERT_TRUE(ref_s.ok());
      auto ref = RunAll(**ref_s, {reqs[i]});
      ASSERT_EQ(got[i].result.reason, FinishReason::kLength) << got[i].result.error.ToString();
      EXPECT_EQ(got[i].tokens, ref[0].tokens) << "wave " << wave << " request " << i;
      ASSERT_EQ(got[i].logits.size(), ref[0].logits.size());
      for (size_t k = 0; k < ref[0].logits.size(); ++k) {
        EXPECT_LT(testing::MaxRelDiff(got[i].logits[k], ref[0].logits[k]), 1e-4) << "wave " << wave << " request " << i << " step " << k;
      }
    }
  }
  const SchedulerMetrics mt = (*split)->metrics();
  EXPECT_GT(mt.cached_tokens, 0);
  EXPECT_GT(mt.partial_copies, 0);
  EXPECT_GT(mt.preemptions + mt.evicted_blocks, 0);
  EXPECT_EQ((*split)->cache().CheckInvariants(), "");
  ASSERT_NE(exec, nullptr);
  EXPECT_EQ(exec->max_in_flight(), sc.depth) << "the pipeline never filled";
}

// A prompt cancelled mid-prefill launches nothing more: it ends when its chunks in flight
// are back, without computing the rest.
TEST(SplitSchedulerCancelTest, ACancelledPromptStopsLaunching) {
  auto head = LoadPart({.first_layer = 0, .last_layer = 1, .embed = true, .head = true});
  auto node = LoadPart({.first_layer = 1, .last_layer = 2, .embed = false, .head = false});
  ThreadPool threads(1);
  SchedulerOptions o;
  o.block_size = 8;
  o.n_ctx = 256;
  o.kv_blocks = 64;
  o.prefill_chunk = 16;
  SplitExecutor* exec = nullptr;
  o.executor = [&](const PagedKv& kv, int32_t n_blocks, int max_tokens, int max_logits, ThreadPool& tp)
      -> Result<std::unique_ptr<StepExecutor>> {
    auto e = std::make_unique<SplitExecutor>(*head, std::vector<const Model*>{node.get()}, kv, n_blocks, max_tokens,
                                             max_logits, tp, 2);
    exec = e.get();
    return std::unique_ptr<StepExecutor>(std::move(e));
  };
  auto s = Scheduler::Create(*head, o, threads);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  RequestResult res;
  auto id = (*s)->Submit(Greedy(std::vector<int32_t>(200, 7), 8, false), nullptr,
                         [&](RequestId, const RequestResult& r) { res = r; });
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 3; ++i) (*s)->Step();
  const int64_t launched = exec->launched();
  (*s)->Cancel(*id);
  (*s)->RunUntilIdle();
  EXPECT_EQ(res.reason, FinishReason::kCancelled);
  EXPECT_LE(exec->launched(), launched) << "chunks were launched after the cancel";
  EXPECT_LT(exec->launched(), 13) << "the whole 200-token prompt was computed";
  EXPECT_EQ((*s)->pool().n_used(), (*s)->cache().stats().n_cached_blocks);
}

INSTANTIATE_TEST_SUITE_P(Splits, SplitSchedulerTest,
                         ::testing::Values(SplitCase{1, 1}, SplitCase{1, 2}, SplitCase{0, 2}, SplitCase{0, 3}),
                         [](const ::testing::TestParamInfo<SplitCase>& i) {
                           return "head" + std::to_string(i.param.head_layers) + "_depth" + std::to_string(i.param.depth);
                         });

}  // namespace
}  // namespace trellis
