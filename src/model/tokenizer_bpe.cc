// Byte-level BPE tokenization (llama.cpp's llm_tokenizer_bpe).
//
// The run is decoded to codepoints (malformed bytes -> U+FFFD, as llama.cpp), split into
// words by the pre-tokenizer, and each word re-encoded to UTF-8 and mapped byte by byte
// through GPT-2's byte->unicode alphabet. With ignore_merges (llama3) a word that is itself
// a vocab token is emitted as is. Otherwise the word starts as one symbol per character;
// adjacent pairs found in the merge list are queued by rank, and the lowest rank (leftmost
// on ties) is merged repeatedly, queueing the new neighbours. Final symbols map to their
// token; a symbol without one falls back to one-byte tokens, skipping bytes that have none
// (llama.cpp's behaviour). O(n log n) per word.

#include <algorithm>
#include <cstring>
#include <queue>

#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace trellis::tokenizer_internal {
namespace {

struct Symbol {
  int32_t prev;
  int32_t next;  // -1 at the ends
  uint32_t offset;
  uint32_t len;  // bytes; 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t right;
  uint32_t len;  // left.len + right.len when queued
};

// std::priority_queue pops the "largest": lowest rank first, then the smallest left index.
struct CandidateLess {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

// Merges one byte-encoded word and appends its ids. Scratch buffers are reused across words.
class WordMerger {
 public:
  explicit WordMerger(const Vocab& vocab) : vocab_(vocab) {}

  void Encode(std::string_view word, std::vector<int32_t>* out) {
    if (vocab_.ignore_merges) {
      if (auto id = vocab_.Find(word)) {
        out->push_back(*id);
        return;
      }
    }
    word_ = word;
    symbols_.clear();
    for (size_t off = 0; off < word.size();) {
      const size_t len = std::min(Utf8LenFromLead(static_cast<uint8_t>(word[off])), word.size() - off);
      const int32_t index = static_cast<int32_t>(symbols_.size());
      off += len;
      symbols_.push_back(Symbol{index - 1, off == word.size() ? -1 : index + 1,
                                static_cast<uint32_t>(off - len), static_cast<uint32_t>(len)});
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) TryPair(i - 1, i);

    while (!queue_.empty()) {
      const Candidate c = queue_.top();
      queue_.pop();
      Symbol& l = symbols_[c.left];
      Symbol& r = symbols_[c.right];
      // Stale if either side was merged away or grew since queued (lengths only grow).
      if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = c.left;
      TryPair(l.prev, c.left);
      TryPair(c.left, l.next);
    }

    for (const Symbol& sym : symbols_) {
      if (sym.len == 0) continue;
      const std::string_view piece = word.substr(sym.offset, sym.len);
      if (auto id = vocab_.Find(piece)) {
        out->push_back(*id);
        continue;
      }
      for (size_t k = 0; k < piece.size(); ++k) {
        if (auto id = vocab_.Find(piece.substr(k, 1))) out->push_back(*id);
      }
    }
  }

 private:
  void TryPair(int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols_[left];
    const Symbol& r = symbols_[right];
    MergeKey(word_.substr(l.offset, l.len), word_.substr(r.offset, r.len), &key_);
    auto it = vocab_.merge_ranks.find(key_);
    if (it == vocab_.merge_ranks.end()) return;
    queue_.push(Candidate{it->second, left, right, l.len + r.len});
  }

  const Vocab& vocab_;
  std::string_view word_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateLess> queue_;
  std::string key_;
};

}  // namespace

void MergeKey(std::string_view left, std::string_view right, std::string* key) {
  const uint32_t left_len = static_cast<uint32_t>(left.size());
  key->assign(reinterpret_cast<const char*>(&left_len), sizeof(left_len));
  key->append(left);
  key->append(right);
}

void EncodeBpe(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  const std::vector<uint32_t> cpts = CodepointsFromUtf8(text);
  const std::vector<size_t> words =
      vocab.pre == PreTokenizer::kLlama3 ? SplitLlama3(cpts) : vocab.pre == PreTokenizer::kQwen2 ? SplitLlama3(cpts, 1) : SplitGpt2(cpts);

  WordMerger merger(vocab);
  std::string utf8;
  std::string encoded;
  size_t start = 0;
  for (size_t n : words) {
    utf8.clear();
    for (size_t i = start; i < start + n; ++i) AppendUtf8(cpts[i], &utf8);
    start += n;
    encoded.clear();
    for (char ch : utf8) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(ch)), &encoded);
    merger.Encode(encoded, out);
  }
}

}  // namespace trellis::tokenizer_internal
