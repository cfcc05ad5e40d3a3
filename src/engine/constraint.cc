#include "engine/constraint.h"

#include <algorithm>

namespace trellis {

std::shared_ptr<const grammar::TokenVocabulary> MakeTokenVocabulary(const Tokenizer& tok,
                                                                    std::span<const int32_t> rendered) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < n; ++id) {
    if (tok.IsEog(id)) {
      eog.push_back(id);
      continue;
    }
    pieces[static_cast<size_t>(id)] =
        tok.TokenToPiece(id, /*render_special=*/std::binary_search(rendered.begin(), rendered.end(), id));
  }
  return std::make_shared<grammar::TokenVocabulary>(std::move(pieces), std::move(eog));
}

std::shared_ptr<const grammar::CompiledGrammar> GrammarCache::Get(const grammar::Grammar& g) {
  const uint64_t key = g.Hash();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    ++hits_;
    return it->second->second;
  }
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(g, vocab_);
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

size_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace trellis
