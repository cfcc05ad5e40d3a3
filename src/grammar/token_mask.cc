#include "grammar/token_mask.h"

#include <algorithm>
#include <array>
#include <deque>
#include <bit>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <unordered_map>

namespace trellis::grammar {
namespace {

bool Has(std::span<const StackId> set, StackId id) { return std::binary_search(set.begin(), set.end(), id); }

bool Live(std::span<const StackId> set) {
  // Sets are sorted and kAccepted / kContext are the two smallest ids.
  return !set.empty() && set.back() > kContext;
}

// Reads the tokens `order` (indices into the vocabulary's byte order, ascending) from
// `start` as a trie: tokens sharing their first d bytes are contiguous in byte order, so
// the set after those bytes is computed once for all of them, and when it dies (no live
// stack is left) the whole range is decided at once instead of token by token. Calls
// on_token(k, allowed, context) for each token read to its end or to a live end, and
// on_dead(first, last, context) for a range [first, last) of `order` refused together;
// allowed when the bytes are read to the end (the set after them is non-empty: live
// stacks, kContext or kAccepted); context when not allowed but a kContext was reached
// before the last byte, i.e. the frames below would decide.
// The sets met in one walk, interned, with their transitions by byte: inside a string or
// a repetition the walk meets the same few sets at every depth of the trie, so most
// steps become a table lookup instead of an Advance. Bounded (kMaxSets sets, kMaxIds
// stack ids in all); past the bound the walk advances without it.
class SetCache {
 public:
  static constexpr int32_t kNone = -1;
  static constexpr size_t kMaxSets = 2048;
  static constexpr size_t kMaxIds = size_t{1} << 18;

  // The id of `set`, interned if new and there is room; kNone otherwise.
  int32_t Intern(std::span<const StackId> set) {
    const uint64_t h = Hash(set);
    auto [lo, hi] = index_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      const std::vector<StackId>& c = sets_[static_cast<size_t>(it->second)];
      if (std::equal(c.begin(), c.end(), set.begin(), set.end())) return it->second;
    }
    if (sets_.size() >= kMaxSets || ids_ + set.size() > kMaxIds) return kNone;
    const auto id = static_cast<int32_t>(sets_.size());
    sets_.emplace_back(set.begin(), set.end());
    next_.emplace_back();
    next_.back().fill(kUnknown);
    ids_ += set.size();
    index_.emplace(h, id);
    return id;
  }
  std::span<const StackId> set(int32_t id) const { return sets_[static_cast<size_t>(id)]; }
  // The id after reading `byte` from set `id`: kUnknown if not computed yet, kNone if it
  // did not fit.
  static constexpr int32_t kUnknown = -2;
  int32_t& next(int32_t id, uint8_t byte) { return next_[static_cast<size_t>(id)][byte]; }

 private:
  static uint64_t Hash(std::span<const StackId> set) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ set.size();
    for (StackId s : set) h = (h ^ s) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
  }
  std::deque<std::vector<StackId>> sets_;  // a deque: spans into it stay valid as it grows
  std::deque<std::array<int32_t, 256>> next_;
  std::unordered_multimap<uint64_t, int32_t> index_;
  size_t ids_ = 0;
};

template <typename OnToken, typename OnDead>
class TrieWalk {
 public:
  TrieWalk(StackMachine& m, const TokenVocabulary& vocab, std::span<const uint32_t> order, OnToken& on_token,
           OnDead& on_dead)
      : m_(m), vocab_(vocab), order_(order), on_token_(on_token), on_dead_(on_dead) {}

  Status Run(std::span<const StackId> start) {
    own_.assign(1, std::vector<StackId>(start.begin(), start.end()));
    view_.assign(1, own_[0]);
    memo_.assign(1, cache_.Intern(start));
    if (memo_[0] != SetCache::kNone) view_[0] = cache_.set(memo_[0]);
    return Visit(0, order_.size(), 0, false);
  }

 private:
  std::string_view Bytes(size_t i) const { return vocab_.sorted_bytes(order_[i]); }

  // view_[d + 1] (and memo_[d + 1]): the set after reading `c` from view_[d].
  Status Step(size_t d, uint8_t c) {
    const int32_t from = memo_[d];
    if (from != SetCache::kNone) {
      int32_t& to = cache_.next(from, c);
      if (to == SetCache::kUnknown) {
        TRELLIS_RETURN_IF_ERROR(m_.Advance(view_[d], c, own_[d + 1]));
        to = cache_.Intern(own_[d + 1]);
        if (to == SetCache::kNone) {
          memo_[d + 1] = SetCache::kNone;
          view_[d + 1] = own_[d + 1];
          return Status::Ok();
        }
      }
      if (to != SetCache::kNone) {
        memo_[d + 1] = to;
        view_[d + 1] = cache_.set(to);
        return Status::Ok();
      }
      // Did not fit the cache when first met: computed again.
    }
    TRELLIS_RETURN_IF_ERROR(m_.Advance(view_[d], c, own_[d + 1]));
    memo_[d + 1] = SetCache::kNone;
    view_[d + 1] = own_[d + 1];
    return Status::Ok();
  }

  // Tokens order_[b, e) share their first d bytes, after which the set is view_[d];
  // ctx_before: kContext was in one of view_[0 .. d-1].
  Status Visit(size_t b, size_t e, size_t d, bool ctx_before) {
    const std::span<const StackId> set = view_[d];
    // A token equal to the shared prefix sorts before its extensions.
    while (b < e && Bytes(b).size() == d) {
      const bool allowed = !set.empty();
      on_token_(order_[b], allowed, !allowed && ctx_before);
      ++b;
    }
    if (b == e) return Status::Ok();
    const bool ctx = ctx_before || Has(set, kContext);
    if (!Live(set)) {
      on_dead_(b, e, ctx);
      return Status::Ok();
    }
    if (own_.size() <= d + 1) {
      own_.emplace_back();
      view_.emplace_back();
      memo_.push_back(SetCache::kNone);
    }
    while (b < e) {
      const auto c = static_cast<uint8_t>(Bytes(b)[d]);
      // Every token here is longer than d and they are sorted by byte d (unsigned, as
      // std::string orders them): the child of c ends where that byte grows.
      size_t lo = b + 1, hi = e;
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (static_cast<uint8_t>(Bytes(mid)[d]) <= c) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      TRELLIS_RETURN_IF_ERROR(Step(d, c));
      TRELLIS_RETURN_IF_ERROR(Visit(b, lo, d + 1, ctx));
      b = lo;
    }
    return Status::Ok();
  }

  StackMachine& m_;
  const TokenVocabulary& vocab_;
  std::span<const uint32_t> order_;
  OnToken& on_token_;
  OnDead& on_dead_;
  SetCache cache_;
  // [d]: the set after the first d bytes of the current path, as a view into the cache or
  // into own_[d]; memo_[d] its id in the cache (kNone when not there).
  std::vector<std::vector<StackId>> own_;
  std::vector<std::span<const StackId>> view_;
  std::vector<int32_t> memo_;
};

template <typename OnToken, typename OnDead>
Status Walk(StackMachine& m, const TokenVocabulary& vocab, std::span<const StackId> start,
            std::span<const uint32_t> order, OnToken&& on_token, OnDead&& on_dead) {
  TrieWalk<std::remove_reference_t<OnToken>, std::remove_reference_t<OnDead>> w(m, vocab, order, on_token, on_dead);
  return w.Run(start);
}

}  // namespace

size_t TokenMask::Count() const {
  size_t n = 0;
  for (uint64_t w : words_) n += static_cast<size_t>(std::popcount(w));
  return n;
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog)
    : pieces_(std::move(pieces)), eog_(std::move(eog)) {
  std::sort(eog_.begin(), eog_.end());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (!pieces_[i].empty() && !is_eog(static_cast<int32_t>(i))) sorted_.push_back(static_cast<int32_t>(i));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    const std::string& pa = pieces_[static_cast<size_t>(a)];
    const std::string& pb = pieces_[static_cast<size_t>(b)];
    return pa != pb ? pa < pb : a < b;
  });
  offsets_.reserve(sorted_.size() + 1);
  offsets_.push_back(0);
  for (int32_t id : sorted_) {
    bytes_ += pieces_[static_cast<size_t>(id)];
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
  iota_.resize(sorted_.size());
  std::iota(iota_.begin(), iota_.end(), 0u);
}

bool TokenVocabulary::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const TokenVocabulary> vocab)
    : g_(std::move(g)), vocab_(std::move(vocab)) {}

size_t CompiledGrammar::cached_positions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return positions_.size();
}

size_t CompiledGrammar::expanded_positions() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [key, p] : positions_) n += p->expand ? 1 : 0;
  return n;
}

Result<const CompiledGrammar::Position*> CompiledGrammar::PositionFor(std::span<const Frame> frames,
                                                                      bool whole) const {
  std::string key(frames.size() * 8 + 1, '\0');
  for (size_t i = 0; i < frames.size(); ++i) {
    std::memcpy(key.data() + 8 * i, &frames[i].pos, 4);
    std::memcpy(key.data() + 8 * i + 4, &frames[i].utf8, 4);
  }
  key.back() = whole ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = positions_.find(key); it != positions_.end()) return it->second.get();
  scratch_.Clear();
  StackMachine m(g_, scratch_);
  std::vector<StackId> start;
  TRELLIS_RETURN_IF_ERROR(m.StartLocal(frames, whole, start));
  auto p = std::make_unique<Position>();
  const bool deeper = !whole && frames.size() < kMaxKeyFrames;
  if (deeper && Has(start, kContext)) {
    // The frames may end before reading anything: every token they refuse would depend
    // on the frames below, so go one deeper without the walk.
    scratch_.Clear();
    p->expand = true;
    const Position* out = p.get();
    positions_.emplace(std::move(key), std::move(p));
    return out;
  }
  std::vector<int32_t> allowed;
  const std::span<const uint32_t> all = vocab_->all_sorted();
  TRELLIS_RETURN_IF_ERROR(Walk(
      m, *vocab_, start, all,
      [&](uint32_t k, bool ok, bool ctx) {
        if (ok) allowed.push_back(vocab_->sorted_id(k));
        if (ctx) p->context.push_back(k);
      },
      [&](size_t first, size_t last, bool ctx) {
        if (ctx) p->context.insert(p->context.end(), all.begin() + first, all.begin() + last);
      }));
  scratch_.Clear();
  const size_t n_vocab = static_cast<size_t>(vocab_->n_vocab());
  // Each step would walk the context tokens against the whole stack: past 1/16 of the
  // vocabulary, one frame more is cheaper (computed once).
  if (deeper && p->context.size() > std::max<size_t>(64, n_vocab / 16)) {
    p = std::make_unique<Position>();
    p->expand = true;
  } else if (allowed.size() * 32 > n_vocab) {
    p->allowed_bits.assign((n_vocab + 63) / 64, 0);
    for (int32_t id : allowed) p->allowed_bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  } else {
    p->allowed_ids = std::move(allowed);
  }
  const Position* out = p.get();
  positions_.emplace(std::move(key), std::move(p));
  return out;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled)
    : compiled_(std::move(compiled)), machine_(compiled_->grammar(), arena_) {}

Result<std::unique_ptr<GrammarMatcher>> GrammarMatcher::Make(std::shared_ptr<const CompiledGrammar> compiled) {
  std::unique_ptr<GrammarMatcher> m(new GrammarMatcher(std::move(compiled)));
  TRELLIS_RETURN_IF_ERROR(m->machine_.Start(m->stacks_));
  return m;
}

bool GrammarMatcher::complete() const { return !ended_ && Has(stacks_, kAccepted); }

Status GrammarMatcher::FillMask(TokenMask& mask) {
  mask.Clear();
  if (ended_) return Status::Ok();
  const TokenVocabulary& vocab = compiled_->vocab();
  std::span<uint64_t> words = mask.words();
  for (StackId s : stacks_) {
    if (s == kAccepted) {
      for (int32_t id : vocab.eog()) mask.Set(id);
      continue;
    }
    // The top frame, and more while the position says the frames below decide too much.
    key_.clear();
    StackId below = s;
    const CompiledGrammar::Position* p = nullptr;
    do {
      key_.push_back(arena_.frame(below));
      below = key_.back().parent;
      TRELLIS_ASSIGN_OR_RETURN(p, compiled_->PositionFor(key_, below == kAccepted));
    } while (p->expand);
    if (!p->allowed_bits.empty()) {
      for (size_t i = 0; i < words.size(); ++i) words[i] |= p->allowed_bits[i];
    } else {
      for (int32_t id : p->allowed_ids) mask.Set(id);
    }
    if (!p->context.empty()) {
      const StackId one[1] = {s};
      TRELLIS_RETURN_IF_ERROR(Walk(
          machine_, vocab, one, p->context,
          [&](uint32_t k, bool ok, bool) {
            if (ok) mask.Set(vocab.sorted_id(k));
          },
          [](size_t, size_t, bool) {}));
    }
  }
  return Status::Ok();
}

Status GrammarMatcher::Accept(int32_t token) {
  if (ended_) return InvalidArgument("grammar: a token after the end");
  const TokenVocabulary& vocab = compiled_->vocab();
  if (token < 0 || token >= vocab.n_vocab()) return InvalidArgument("grammar: token id out of range");
  if (vocab.is_eog(token)) {
    if (!complete()) return InvalidArgument("grammar: end of generation before the grammar is complete");
    ended_ = true;
    stacks_.clear();
    return Status::Ok();
  }
  const std::string_view piece = vocab.piece(token);
  if (piece.empty()) return InvalidArgument("grammar: a control token inside constrained text");
  return AcceptBytes(piece);
}

Status GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (ended_) return InvalidArgument("grammar: text after the end");
  std::vector<StackId> set = stacks_;
  TRELLIS_RETURN_IF_ERROR(machine_.AdvanceBytes(set, bytes));
  if (set.empty()) return InvalidArgument("grammar: the text does not match");
  stacks_ = std::move(set);
  MaybeCompact();
  return Status::Ok();
}

Result<bool> GrammarMatcher::Allows(std::string_view bytes) {
  if (ended_) return false;
  std::vector<StackId> set = stacks_;
  TRELLIS_RETURN_IF_ERROR(machine_.AdvanceBytes(set, bytes));
  return !set.empty();
}

void GrammarMatcher::MaybeCompact() {
  // Frames are never freed while a matcher lives; when the arena is mostly garbage
  // (frames of paths that died, tokens tried by masks), copy the live stacks to a new one.
  if (arena_.size() < compact_at_) return;
  StackArena fresh;
  std::unordered_map<StackId, StackId> moved{{kAccepted, kAccepted}, {kContext, kContext}};
  std::vector<StackId> chain;
  for (StackId& s : stacks_) {
    chain.clear();
    StackId id = s;
    while (!moved.count(id)) {
      chain.push_back(id);
      id = arena_.frame(id).parent;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Frame& f = arena_.frame(*it);
      moved[*it] = fresh.Intern(f.pos, f.utf8, moved.at(f.parent));
    }
    s = moved.at(s);
  }
  std::sort(stacks_.begin(), stacks_.end());
  arena_ = std::move(fresh);
  // Next time when the garbage is again as large as what lives: amortized linear.
  compact_at_ = std::max(kCompactAt, 2 * arena_.size());
}

}  // namespace trellis::grammar
