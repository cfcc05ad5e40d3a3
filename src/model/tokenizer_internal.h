// Shared vocabulary data and the per-algorithm encoders behind Tokenizer (internal to
// src/model; include model/tokenizer.h instead).
//
//   tokenizer.cc            metadata loading, special-token partitioning, pieces, Decode
//   tokenizer_spm.cc        SentencePiece-style score merging with byte fallback
//   tokenizer_bpe.cc        byte-level BPE merging by rank
//   tokenizer_pretokenize.cc  GPT-2 / llama3 pre-tokenizer regexes, hand-written
//
// Thread safety: a Vocab is immutable once built; encoders keep their scratch on the stack.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace trellis::tokenizer_internal {

// Token attributes, as llama.cpp's llama_token_attr derived from tokenizer.ggml.token_type
// (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). A token can carry
// several bits: llama.cpp ORs kControl into end-of-generation tokens found by their text.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
};

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
  bool eog = false;  // ends generation
};

// Hash for unordered_map<std::string, ...> lookups by string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

enum class PreTokenizer { kNone, kGpt2, kLlama3, kQwen2 };

struct Vocab {
  TokenizerKind kind = TokenizerKind::kSpm;
  PreTokenizer pre = PreTokenizer::kNone;
  std::vector<TokenData> tokens;         // (n_vocab)
  StringMap token_to_id;                 // text -> id; on duplicate texts the last id wins
  StringMap merge_ranks;                 // MergeKey(left, right) -> rank (BPE only)
  std::vector<std::string> pieces;       // (n_vocab) TokenToPiece with render_special
  std::vector<int32_t> special_tokens;   // control/user-defined/unknown, longest text first
  int32_t byte_tokens[256];              // SPM byte fallback id per byte, -1 if none

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool ignore_merges = false;  // BPE: a word that is itself a token is not merged (llama3)
  bool clean_spaces = false;   // Decode: llama.cpp's clean-up of spaces (BPE)

  std::optional<int32_t> Find(std::string_view text) const {
    auto it = token_to_id.find(text);
    if (it == token_to_id.end()) return std::nullopt;
    return it->second;
  }
};

// Key of a BPE merge pair in Vocab::merge_ranks: unambiguous for any left/right bytes.
void MergeKey(std::string_view left, std::string_view right, std::string* key);

// Appends the ids of one SPM text run (raw text, spaces not yet escaped). prefix_space:
// prepend a space first (add_space_prefix at the start / after a special token).
void EncodeSpm(const Vocab& vocab, std::string_view text, bool prefix_space,
               std::vector<int32_t>* out);

// Appends the ids of one BPE text run.
void EncodeBpe(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

// Splits codepoints into pre-tokenizer words; returns each word's length in codepoints
// (sum == cpts.size(), all > 0).
std::vector<size_t> SplitGpt2(const std::vector<uint32_t>& cpts);
// max_digits: the \p{N}{1,3} of llama3; 1 gives Qwen2's \p{N} (one word per digit).
std::vector<size_t> SplitLlama3(const std::vector<uint32_t>& cpts, size_t max_digits = 3);

}  // namespace trellis::tokenizer_internal
