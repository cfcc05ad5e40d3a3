#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <numeric>

namespace trellis::grammar {
namespace {

bool Has(std::span<const StackId> set, StackId id) { return std::binary_search(set.begin(), set.end(), id); }

bool Live(std::span<const StackId> set) {
  // Sets are sorted and kAccepted / kContext are the two smallest ids.
  return !set.empty() && set.back() > kContext;
}

// Reads the tokens `order` (indices into the vocabulary's byte order, ascending) from
// `start`, sharing the work over common prefixes. For each token calls
// on_token(k, allowed, context): allowed when its bytes are read to the end (the set after
// them is non-empty: live stacks, kContext or kAccepted); context when not allowed but a
// kContext was reached before its last byte, i.e. the frames below would decide.
template <typename F>
Status Walk(StackMachine& m, const TokenVocabulary& vocab, std::span<const StackId> start,
            std::span<const uint32_t> order, F&& on_token) {
  std::vector<std::vector<StackId>> sets(1, std::vector<StackId>(start.begin(), start.end()));
  std::vector<bool> ctx_before(1, false);  // [d]: kContext in sets[0 .. d-1]
  size_t depth = 0;                          // sets[0 .. depth] hold the prefix of `prev`
  std::string_view prev;
  for (uint32_t k : order) {
    const std::string_view tok = vocab.sorted_bytes(k);
    size_t l = 0;
    const size_t lim = std::min({prev.size(), tok.size(), depth});
    while (l < lim && prev[l] == tok[l]) ++l;
    size_t d = l;
    while (d < tok.size() && Live(sets[d])) {
      if (sets.size() <= d + 1) {
        sets.emplace_back();
        ctx_before.push_back(false);
      }
      TRELLIS_RETURN_IF_ERROR(m.Advance(sets[d], static_cast<uint8_t>(tok[d]), sets[d + 1]));
      ctx_before[d + 1] = ctx_before[d] || Has(sets[d], kContext);
      ++d;
    }
    depth = d;
    prev = tok;
    if (d == tok.size()) {
      const bool allowed = !sets[d].empty();
      on_token(k, allowed, !allowed && ctx_before[d]);
    } else {
      on_token(k, false, ctx_before[d] || Has(sets[d], kContext));
    }
  }
  return Status::Ok();
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

Result<const CompiledGrammar::Position*> CompiledGrammar::PositionFor(uint32_t pos, Utf8Partial utf8) const {
  const uint64_t key = static_cast<uint64_t>(pos) << 32 | utf8;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = positions_.find(key); it != positions_.end()) return it->second.get();
  scratch_.Clear();
  StackMachine m(g_, scratch_);
  std::vector<StackId> start;
  TRELLIS_RETURN_IF_ERROR(m.StartLocal(pos, utf8, start));
  auto p = std::make_unique<Position>();
  std::vector<int32_t> allowed;
  TRELLIS_RETURN_IF_ERROR(Walk(m, *vocab_, start, vocab_->all_sorted(), [&](uint32_t k, bool ok, bool ctx) {
    if (ok) allowed.push_back(vocab_->sorted_id(k));
    if (ctx) p->context.push_back(k);
  }));
  scratch_.Clear();
  const size_t n_vocab = static_cast<size_t>(vocab_->n_vocab());
  if (allowed.size() * 32 > n_vocab) {
    p->allowed_bits.assign((n_vocab + 63) / 64, 0);
    for (int32_t id : allowed) p->allowed_bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  } else {
    p->allowed_ids = std::move(allowed);
  }
  const Position* out = p.get();
  positions_.emplace(key, std::move(p));
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
    const Frame f = arena_.frame(s);
    TRELLIS_ASSIGN_OR_RETURN(const CompiledGrammar::Position* p, compiled_->PositionFor(f.pos, f.utf8));
    if (!p->allowed_bits.empty()) {
      for (size_t i = 0; i < words.size(); ++i) words[i] |= p->allowed_bits[i];
    } else {
      for (int32_t id : p->allowed_ids) mask.Set(id);
    }
    if (!p->context.empty()) {
      const StackId one[1] = {s};
      TRELLIS_RETURN_IF_ERROR(Walk(machine_, vocab, one, p->context, [&](uint32_t k, bool ok, bool) {
        if (ok) mask.Set(vocab.sorted_id(k));
      }));
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
