// Token masks: which tokens of a vocabulary may come next under a grammar.
//
// A token is allowed exactly when its bytes, read from the current parse state, leave a
// document that can still be completed (Grammar::Finish guarantees every live stack can
// complete), and an end-of-generation token exactly when the document is complete.
//
// The cost is kept off the decode path with the idea of xgrammar (Dong et al., 2024): for
// a grammar position (the top frame of a stack) most tokens are decided by that frame
// alone, because their bytes are read without leaving the frame's rule: they are allowed
// or refused whatever lies below. Those sets are computed once per position and cached in
// the CompiledGrammar; only the few context-dependent tokens (those that finish the rule
// and continue into the frames below) are walked against the whole stack at each step.
// Tokens are walked in byte order so that common prefixes are read once.
//
// Thread safety: TokenVocabulary and CompiledGrammar are immutable to their users and
// safe to share (the position cache is filled under a mutex); a GrammarMatcher belongs to
// one session on one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/stacks.h"
#include "util/status.h"

namespace trellis::grammar {

// A set of token ids, one bit each.
class TokenMask {
 public:
  explicit TokenMask(int n_vocab = 0) : n_(n_vocab), words_((static_cast<size_t>(n_vocab) + 63) / 64, 0) {}
  void Clear() { std::fill(words_.begin(), words_.end(), 0); }
  void Set(int32_t id) { words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }
  bool Test(int32_t id) const { return (words_[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
  size_t Count() const;
  int n_vocab() const { return n_; }
  std::span<uint64_t> words() { return words_; }
  std::span<const uint64_t> words() const { return words_; }

 private:
  int n_;
  std::vector<uint64_t> words_;
};

class TokenVocabulary {
 public:
  // pieces[id]: the bytes token id adds to the text; empty for tokens that never belong in
  // constrained text (control tokens, unused slots). eog: the ids that end generation.
  TokenVocabulary(std::vector<std::string> pieces, std::vector<int32_t> eog);

  int n_vocab() const { return static_cast<int>(pieces_.size()); }
  std::string_view piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog() const { return eog_; }

  // The tokens with bytes, sorted by them: k-th id and bytes.
  size_t n_sorted() const { return sorted_.size(); }
  int32_t sorted_id(size_t k) const { return sorted_[k]; }
  std::string_view sorted_bytes(size_t k) const {
    return std::string_view(bytes_.data() + offsets_[k], offsets_[k + 1] - offsets_[k]);
  }
  std::span<const uint32_t> all_sorted() const { return iota_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;  // sorted
  std::vector<int32_t> sorted_;
  // The sorted tokens' bytes back to back (walks read them in this order).
  std::string bytes_;
  std::vector<uint32_t> offsets_;  // n_sorted + 1
  std::vector<uint32_t> iota_;  // 0 .. n_sorted - 1
};

// A grammar bound to a vocabulary, with its per-position token sets.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return g_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  // Tokens decided by the top frames of a stack alone. When the top frame alone leaves
  // too many tokens to the frames below (a rule that may end at once, such as a string of
  // at most N characters, makes every token it refuses depend on what follows), the
  // position is keyed one frame deeper instead (xgrammar's context expansion), up to
  // kMaxKeyFrames frames or the whole stack.
  struct Position {
    bool expand = false;                 // look up with one frame more instead
    std::vector<uint64_t> allowed_bits;  // allowed whatever lies below (bitset, or empty)
    std::vector<int32_t> allowed_ids;    // the same as a list when few
    std::vector<uint32_t> context;       // sorted indices (TokenVocabulary order) that depend on the frames below
  };
  static constexpr size_t kMaxKeyFrames = 4;
  // The position of the top `frames` of a stack (top first, at most kMaxKeyFrames;
  // `whole`: they are the whole stack). Computed on first use (one walk of the
  // vocabulary), then cached.
  Result<const Position*> PositionFor(std::span<const Frame> frames, bool whole) const;
  size_t cached_positions() const;
  size_t expanded_positions() const;  // of which keyed one frame deeper instead

 private:
  Grammar g_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::unique_ptr<Position>> positions_;  // GUARDED_BY(mu_)
  mutable StackArena scratch_;                                               // GUARDED_BY(mu_)
};

// One constrained generation: the parse state after the tokens accepted so far.
class GrammarMatcher {
 public:
  // REQUIRES: compiled is not null.
  static Result<std::unique_ptr<GrammarMatcher>> Make(std::shared_ptr<const CompiledGrammar> compiled);

  // The tokens allowed next. mask.n_vocab() == vocab().n_vocab().
  Status FillMask(TokenMask& mask);
  // Reads one token (an end-of-generation token only when complete()). InvalidArgument
  // if the token is not allowed; the state is then unchanged.
  Status Accept(int32_t token);
  // Reads text (tests, and prefilled answers).
  Status AcceptBytes(std::string_view bytes);
  // Whether a token of `bytes` would be accepted (the slow reference, one token at a time).
  Result<bool> Allows(std::string_view bytes);

  // The document read so far is complete (an end-of-generation token is allowed).
  bool complete() const;
  // Nothing but the end can follow.
  bool only_end() const { return stacks_.size() == 1 && stacks_[0] == kAccepted; }
  bool ended() const { return ended_; }
  size_t arena_frames() const { return arena_.size(); }  // memory held (tests)
  const CompiledGrammar& compiled() const { return *compiled_; }

 private:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled);
  void MaybeCompact();

  std::shared_ptr<const CompiledGrammar> compiled_;
  StackArena arena_;
  StackMachine machine_;
  std::vector<StackId> stacks_;
  std::vector<Frame> key_;  // scratch of FillMask
  bool ended_ = false;
  static constexpr size_t kCompactAt = size_t{1} << 18;  // frames
  size_t compact_at_ = kCompactAt;
};

}  // namespace trellis::grammar
