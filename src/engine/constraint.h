// Constrained decoding on a model: the bridge from a tokenizer to the grammar library's
// TokenVocabulary, and a cache of grammars compiled for it.
//
// A token's bytes are Tokenizer::TokenToPiece(id) (SPM's "▁" as a space, byte-fallback
// tokens as their byte, BPE's byte alphabet mapped back); control tokens have none and are
// never allowed inside constrained text; end-of-generation tokens end it.
//
// Thread safety: GrammarCache is safe from any thread (one mutex); what it returns is
// immutable to its users (see grammar/token_mask.h).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "grammar/grammar.h"
#include "grammar/token_mask.h"
#include "model/tokenizer.h"

namespace trellis {

// `rendered` (sorted): control tokens that count as their text (the markers of a
// tool-call syntax: see StreamDecoder), so a grammar writing "[TOOL_CALLS]" may pick the
// token the model was trained to emit.
std::shared_ptr<const grammar::TokenVocabulary> MakeTokenVocabulary(const Tokenizer& tok,
                                                                    std::span<const int32_t> rendered = {});

// Compiled grammars by content hash, the most recently used `capacity` kept: an agent
// sending the same schema every turn compiles it, and fills its per-position masks, once.
class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const grammar::TokenVocabulary> vocab, size_t capacity = 64)
      : vocab_(std::move(vocab)), capacity_(capacity) {}
  std::shared_ptr<const grammar::CompiledGrammar> Get(const grammar::Grammar& g);
  const grammar::TokenVocabulary& vocab() const { return *vocab_; }
  size_t hits() const;

 private:
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<uint64_t, std::shared_ptr<const grammar::CompiledGrammar>>> lru_;  // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, decltype(lru_)::iterator> index_;                         // GUARDED_BY(mu_)
  size_t hits_ = 0;                                                                        // GUARDED_BY(mu_)
};

}  // namespace trellis
