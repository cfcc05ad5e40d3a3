// Tokenizers built from GGUF `tokenizer.ggml.*` metadata, reproducing llama.cpp's
// tokenization exactly (same ids for the same text, including malformed UTF-8):
//
//   kSpm ("llama"): SentencePiece-style. Spaces become U+2581, a space is prefixed to each
//        text run that starts the input or follows a special token (add_space_prefix),
//        adjacent symbol pairs are merged greedily by highest vocab score, leftovers fall
//        back to <0xXX> byte tokens.
//   kBpe ("gpt2"): byte-level BPE. Text is split by the pre-tokenizer regex of
//        `tokenizer.ggml.pre` ("gpt-2", or "llama3"/"llama-bpe" and aliases), each word is
//        mapped through GPT-2's byte->unicode alphabet and merged by merge rank.
//
// Both first cut the text at special-token texts (control / user-defined tokens such as
// "<s>" or "<|eot_id|>"): user-defined ones always, control ones only with parse_special.
// The algorithms and the metadata keys read are described in docs/tokenizer.md.
//
// Thread safety: a Tokenizer is immutable after FromGguf; all const methods may be called
// concurrently. A StreamDecoder is a small per-stream state machine: one owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "util/status.h"

namespace trellis {

enum class TokenizerKind { kSpm, kBpe };

namespace tokenizer_internal {
struct Vocab;
}  // namespace tokenizer_internal

// Bytes [begin, end) of a text.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
};

class Tokenizer {
 public:
  // Builds from tokenizer.ggml.* metadata. Errors (naming the key or value) when the model
  // or pre-tokenizer is unknown/unsupported, or required arrays are missing or malformed.
  // The result does not reference `gguf` after returning.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids for `text`, as llama.cpp's llama_tokenize(text, add_special=add_bos,
  // parse_special). add_bos: prepend BOS if the vocab wants it (add_bos()), and append EOS
  // if the vocab asks for add_eos_token. parse_special: also recognize control-token texts
  // ("<s>", "<|eot_id|>") in the text; user-defined tokens are always recognized.
  // Never fails: malformed UTF-8 is tokenized the way llama.cpp does.
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special) const;

  // Encode(text, add_bos, parse_special=true), except that a control-token text is
  // recognized only where the occurrence lies wholly inside one of `special` (sorted,
  // non-overlapping byte ranges of `text`); anywhere else it is tokenized as plain text,
  // as parse_special=false would (user-defined tokens are recognized everywhere, as
  // there). Tokenizing the whole text in one go keeps the ids of text without control
  // texts outside `special` identical to Encode(text, add_bos, true) — no fragment
  // boundaries are added, so SPM's space prefix and BPE merges are unchanged.
  // Used for chat prompts: template markers are special, message content is not.
  std::vector<int32_t> EncodeWithSpecialRanges(std::string_view text, bool add_bos,
                                               std::span<const ByteRange> special) const;

  // An upper bound on the text bytes one token of Encode() covers: the longest piece
  // (special tokens' text included), at least 4 (one UTF-8 character, e.g. as <unk>).
  // A text longer than n * max_token_bytes() cannot encode to n tokens or fewer.
  // O(n_vocab).
  size_t max_token_bytes() const;

  // Bytes of one token: SPM "▁" -> " " and <0xXX> -> that byte; BPE byte-level alphabet
  // mapped back to bytes. Control and unknown tokens give "" unless render_special, in which
  // case their text is returned. Out-of-range ids give "". May be a partial UTF-8 sequence.
  std::string TokenToPiece(int32_t id, bool render_special = false) const;

  // Text of a sequence, as llama.cpp's llama_detokenize(remove_special=false,
  // unparse_special=render_special): pieces concatenated, one leading space stripped from
  // the first token when add_space_prefix is on (SPM), and for BPE vocabs llama.cpp's
  // clean-up of spaces before punctuation and contractions (" ," -> ",", " 's" -> "'s").
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 if none
  int32_t eos_id() const;  // -1 if none
  int32_t eot_id() const;  // -1 if none
  int32_t unk_id() const;  // -1 if none
  int32_t pad_id() const;  // -1 if none
  // End of generation: eos, eot, eom, and the tokens llama.cpp recognizes by text
  // (<|eot_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>, </s>, <end_of_turn>, ...).
  bool IsEog(int32_t id) const;
  // Whether Encode(..., add_bos=true, ...) prepends BOS.
  bool add_bos() const;
  bool add_space_prefix() const;
  // Raw vocab text of a token ("" if out of range).
  std::string_view TokenText(int32_t id) const;
  TokenizerKind kind() const;
  // The id whose vocab text is exactly `text`.
  std::optional<int32_t> FindToken(std::string_view text) const;

 private:
  explicit Tokenizer(std::unique_ptr<const tokenizer_internal::Vocab> vocab);

  std::unique_ptr<const tokenizer_internal::Vocab> vocab_;
};

// Streaming detokenizer for generation. Push() returns the newly completed text: only
// whole, well-formed UTF-8 sequences. Bytes of a sequence split across tokens (e.g. an emoji
// emitted as <0xF0><0x9F><0x98><0x81>) are held until the sequence completes; ill-formed
// bytes are emitted as U+FFFD as soon as they are known to be ill-formed, so nothing stalls.
// Flush() returns what is left (an incomplete tail becomes U+FFFD). Pieces are as from
// TokenToPiece (no leading-space stripping).
//
// Borrows `tok`, which must outlive the decoder. Not thread-safe.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false);
  // Control tokens in `ids` (sorted) are rendered as their text even without
  // render_special: the markers a tool-call syntax is written in ([TOOL_CALLS], ...).
  StreamDecoder(const Tokenizer& tok, std::vector<int32_t> ids) : tok_(tok), render_special_(false), rendered_(std::move(ids)) {}

  std::string Push(int32_t id);
  std::string Flush();

 private:
  // Moves the complete prefix of pending_ to the result; at_end: no more input will come.
  std::string Drain(bool at_end);

  const Tokenizer& tok_;
  bool render_special_;
  std::vector<int32_t> rendered_;  // sorted
  std::string pending_;  // bytes of an incomplete UTF-8 sequence (at most 3)
};

}  // namespace trellis
