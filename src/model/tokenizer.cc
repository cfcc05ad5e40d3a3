// Tokenizer: metadata loading, special-token partitioning, pieces and detokenization.
// The SPM and BPE merge loops live in tokenizer_spm.cc / tokenizer_bpe.cc.

#include "model/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace trellis {

using tokenizer_internal::kAttrByte;
using tokenizer_internal::kAttrControl;
using tokenizer_internal::kAttrNormal;
using tokenizer_internal::kAttrUndefined;
using tokenizer_internal::kAttrUnknown;
using tokenizer_internal::kAttrUnused;
using tokenizer_internal::kAttrUserDefined;
using tokenizer_internal::PreTokenizer;
using tokenizer_internal::Vocab;

namespace {

constexpr std::string_view kKeyModel = "tokenizer.ggml.model";
constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kKeyScores = "tokenizer.ggml.scores";
constexpr std::string_view kKeyTokenType = "tokenizer.ggml.token_type";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581, SPM's visible space

// Pre-tokenizer names (tokenizer.ggml.pre) llama.cpp maps to each regex we implement.
constexpr std::string_view kGpt2PreNames[] = {"gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum",
                                              "exaone4", "mpt", "olmo", "jais", "trillion"};
constexpr std::string_view kQwen2PreNames[] = {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"};
constexpr std::string_view kLlama3PreNames[] = {"llama3", "llama-v3", "llama-bpe", "falcon3",
                                                "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                                                "jina-v5-nano"};

template <size_t N>
bool OneOf(std::string_view s, const std::string_view (&names)[N]) {
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

// Token texts llama.cpp promotes to special roles when the metadata does not name them.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                             "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
// Texts that end generation whatever their declared type.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["};

uint32_t AttrFromTokenType(int64_t type) {
  switch (type) {
    case 1: return kAttrNormal;
    case 2: return kAttrUnknown;
    case 3: return kAttrControl;
    case 4: return kAttrUserDefined;
    case 5: return kAttrUnused;
    case 6: return kAttrByte;
    default: return kAttrUndefined;
  }
}

// Optional key: NotFound -> keep *out; a wrong type is an error.
Status ReadOptionalBool(const GgufFile& gguf, std::string_view key, bool* out) {
  if (!gguf.Has(key)) return Status::Ok();
  TRELLIS_ASSIGN_OR_RETURN(*out, gguf.GetBool(key));
  return Status::Ok();
}

// Optional token id: absent keeps the default; out of range is ignored, like llama.cpp.
Status ReadOptionalId(const GgufFile& gguf, std::string_view key, int32_t n_vocab, int32_t* id) {
  if (*id >= n_vocab) *id = -1;  // a default beyond a small vocab
  if (!gguf.Has(key)) return Status::Ok();
  const GgufValue* v = gguf.Find(key);
  if (!v->IsInteger()) {
    return InvalidArgument(fmt::format("metadata '{}' is {}, expected a token id", key,
                                       GgufValueTypeName(v->type)));
  }
  const bool is_signed = v->type == GgufValueType::kInt8 || v->type == GgufValueType::kInt16 ||
                         v->type == GgufValueType::kInt32 || v->type == GgufValueType::kInt64;
  if (is_signed ? (v->i64 >= 0 && v->i64 < n_vocab) : (v->u64 < static_cast<uint64_t>(n_vocab))) {
    *id = static_cast<int32_t>(is_signed ? v->i64 : static_cast<int64_t>(v->u64));
  }
  return Status::Ok();
}

// Array metadata with its element type checked; nullptr if absent.
Result<const GgufValue*> FindArray(const GgufFile& gguf, std::string_view key,
                                   std::initializer_list<GgufValueType> elem_types) {
  const GgufValue* v = gguf.Find(key);
  if (v == nullptr) return static_cast<const GgufValue*>(nullptr);
  if (v->type != GgufValueType::kArray ||
      std::find(elem_types.begin(), elem_types.end(), v->elem_type) == elem_types.end()) {
    return InvalidArgument(fmt::format("metadata '{}' has type {}{}, not the expected array", key,
                                       GgufValueTypeName(v->type),
                                       v->type == GgufValueType::kArray
                                           ? fmt::format(" of {}", GgufValueTypeName(v->elem_type))
                                           : std::string()));
  }
  return v;
}

Status LoadModelKind(const GgufFile& gguf, Vocab* v) {
  auto model = gguf.GetString(kKeyModel);
  if (!model.ok()) return model.status().WithContext("tokenizer");
  std::string pre;
  if (gguf.Has(kKeyPre)) {
    TRELLIS_ASSIGN_OR_RETURN(pre, gguf.GetString(kKeyPre));
  }
  if (*model == "llama") {
    v->kind = TokenizerKind::kSpm;
    v->pre = PreTokenizer::kNone;
    v->bos = 1;
    v->eos = 2;
    v->unk = 0;
    v->add_space_prefix = true;
    v->add_bos = true;
    v->add_eos = false;
    v->clean_spaces = false;
  } else if (*model == "gpt2") {
    v->kind = TokenizerKind::kBpe;
    v->bos = 11;
    v->eos = 11;
    v->add_space_prefix = false;
    v->clean_spaces = true;
    if (OneOf(pre, kGpt2PreNames)) {
      v->pre = PreTokenizer::kGpt2;
      if (pre == "trillion") v->clean_spaces = false;
    } else if (OneOf(pre, kQwen2PreNames)) {
      v->pre = PreTokenizer::kQwen2;
      v->clean_spaces = false;
    } else if (OneOf(pre, kLlama3PreNames)) {
      v->pre = PreTokenizer::kLlama3;
      v->ignore_merges = true;
      v->add_bos = true;
    } else {
      return Unsupported(fmt::format(
          "tokenizer: pre-tokenizer '{}={}' is not supported for BPE vocabularies (supported: "
          "gpt-2, llama3 and qwen2 families, e.g. 'gpt-2', 'llama-bpe', 'llama3', 'qwen2')",
          kKeyPre, pre.empty() ? "<missing>" : pre));
    }
  } else {
    return Unsupported(fmt::format(
        "tokenizer: model '{}={}' is not supported (supported: 'llama' = SentencePiece, "
        "'gpt2' = byte-level BPE)",
        kKeyModel, *model));
  }
  return ReadOptionalBool(gguf, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix);
}

Status LoadTokens(const GgufFile& gguf, Vocab* v) {
  TRELLIS_ASSIGN_OR_RETURN(const GgufValue* tokens, FindArray(gguf, kKeyTokens, {GgufValueType::kString}));
  if (tokens == nullptr) return NotFound(fmt::format("tokenizer: metadata '{}' is missing", kKeyTokens));
  const size_t n = tokens->strings.size();
  if (n == 0 || n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument(fmt::format("tokenizer: '{}' has {} entries", kKeyTokens, n));
  }
  TRELLIS_ASSIGN_OR_RETURN(const GgufValue* scores,
                           FindArray(gguf, kKeyScores, {GgufValueType::kFloat32, GgufValueType::kInt32}));
  if (scores != nullptr && scores->count < n) {
    return InvalidArgument(fmt::format("tokenizer: '{}' has {} entries for {} tokens", kKeyScores,
                                       scores->count, n));
  }
  TRELLIS_ASSIGN_OR_RETURN(const GgufValue* types, FindArray(gguf, kKeyTokenType, {GgufValueType::kInt32}));
  if (types != nullptr && types->ints.size() < n) {
    return InvalidArgument(fmt::format("tokenizer: '{}' has {} entries for {} tokens", kKeyTokenType,
                                       types->ints.size(), n));
  }
  v->tokens.resize(n);
  v->token_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    tokenizer_internal::TokenData& t = v->tokens[i];
    t.text = tokens->strings[i];
    if (t.text.empty()) t.text = fmt::format("[EMPTY_{}]", i);  // as llama.cpp: never match ""
    if (scores != nullptr) {
      t.score = scores->elem_type == GgufValueType::kFloat32 ? static_cast<float>(scores->floats[i])
                                                             : static_cast<float>(scores->ints[i]);
    }
    t.attr = types != nullptr ? AttrFromTokenType(types->ints[i]) : kAttrNormal;
    v->token_to_id.insert_or_assign(t.text, static_cast<int32_t>(i));
  }
  return Status::Ok();
}

Status LoadMerges(const GgufFile& gguf, Vocab* v) {
  TRELLIS_ASSIGN_OR_RETURN(const GgufValue* merges, FindArray(gguf, kKeyMerges, {GgufValueType::kString}));
  if (merges == nullptr) {
    return NotFound(fmt::format("tokenizer: BPE vocabulary without '{}'", kKeyMerges));
  }
  v->merge_ranks.reserve(merges->strings.size());
  std::string key;
  for (size_t i = 0; i < merges->strings.size(); ++i) {
    const std::string& m = merges->strings[i];
    const size_t sep = m.find(' ', 1);  // a pair may start with a literal space
    if (sep == std::string::npos) continue;
    tokenizer_internal::MergeKey(std::string_view(m).substr(0, sep), std::string_view(m).substr(sep + 1), &key);
    v->merge_ranks.emplace(key, static_cast<int32_t>(i));  // first rank wins
  }
  return Status::Ok();
}

// For a role the metadata left unset, adopt the lowest id whose text is in `texts` and make
// it a control token (llama.cpp does the same, in hash-map order).
template <size_t N>
void DetectRole(Vocab* v, const std::string_view (&texts)[N], int32_t* role) {
  if (*role >= 0) return;
  for (size_t id = 0; id < v->tokens.size(); ++id) {
    if (OneOf(v->tokens[id].text, texts)) {
      *role = static_cast<int32_t>(id);
      v->tokens[id].attr |= kAttrControl;
      return;
    }
  }
}

void MarkEog(Vocab* v, int32_t fim_pad, int32_t fim_rep, int32_t fim_sep) {
  for (auto& t : v->tokens) {
    if (OneOf(t.text, kEogTexts)) {
      t.eog = true;
      t.attr |= kAttrControl;
    }
  }
  for (int32_t id : {v->eos, v->eot, v->eom, fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) v->tokens[id].eog = true;
  }
}

std::string ByteLevelToBytes(std::string_view text) {
  std::string out;
  for (uint32_t cpt : CodepointsFromUtf8(text)) {
    const int byte = UnicodeToByte(cpt);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    // Not in the byte alphabet: llama.cpp renders a marker with the codepoint's bytes.
    std::string utf8;
    AppendUtf8(cpt, &utf8);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) out += fmt::format("{:02x}", static_cast<uint8_t>(c));
    out += text;
    out += "]";
  }
  return out;
}

// The text of a token rendered with special tokens shown (llama.cpp's piece cache).
std::string RenderPiece(const Vocab& v, const tokenizer_internal::TokenData& t) {
  if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return t.text;
  if (t.attr & kAttrNormal) {
    if (v.kind == TokenizerKind::kBpe) return ByteLevelToBytes(t.text);
    std::string out;
    for (size_t i = 0; i < t.text.size();) {
      if (t.text.compare(i, kSpaceEscape.size(), kSpaceEscape) == 0) {
        out.push_back(' ');
        i += kSpaceEscape.size();
      } else {
        out.push_back(t.text[i++]);
      }
    }
    return out;
  }
  if (t.attr & kAttrByte) {  // "<0xAB>"
    unsigned byte = 0;
    if (t.text.size() == 6 && std::sscanf(t.text.c_str() + 3, "%2x", &byte) == 1) {
      return std::string(1, static_cast<char>(byte));
    }
    return std::string();
  }
  return std::string();  // unused / undefined
}

void BuildCaches(Vocab* v) {
  const int32_t n = static_cast<int32_t>(v->tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    if (v->tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      v->special_tokens.push_back(id);
    }
  }
  std::stable_sort(v->special_tokens.begin(), v->special_tokens.end(), [&](int32_t a, int32_t b) {
    return v->tokens[a].text.size() > v->tokens[b].text.size();
  });
  v->pieces.reserve(n);
  for (const auto& t : v->tokens) v->pieces.push_back(RenderPiece(*v, t));
  for (int b = 0; b < 256; ++b) {
    auto id = v->Find(fmt::format("<0x{:02X}>", b));
    if (!id) id = v->Find(std::string(1, static_cast<char>(b)));
    v->byte_tokens[b] = id ? *id : -1;
  }
}

// llama.cpp's detokenizer clean-up (clean_up_tokenization_spaces): drop the space before
// ? ! . , ; collapse " ' " to "'"; join " 's", " 'm", " 're", " 've" to the previous word.
std::string CleanSpaces(const std::string& in) {
  if (in.empty()) return in;
  // 1: " ?" " !" " ." " ,"
  std::string a(1, in[0]);
  for (size_t i = 1; i < in.size(); ++i) {
    const char x = in[i];
    if (in[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  // 2: " ' " -> "'". The space after the quote is consumed and cannot start another match.
  std::string b(1, a[0]);
  bool prev_consumed = false;
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && !prev_consumed && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      b.push_back(x);
      ++i;  // skip the following space
      prev_consumed = true;
      continue;
    }
    prev_consumed = false;
    b.push_back(x);
  }
  // 3: contractions
  std::string c(1, b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (x1 != 't' && x1 != 'd' && i + 2 < b.size()) {
        const char x2 = b[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

// A run of raw text [offset, offset + len) or one special token.
struct Fragment {
  int32_t token;  // -1 for raw text
  size_t offset;
  size_t len;
};

// Whether [b, e) lies wholly inside one of `ranges` (sorted, non-overlapping).
bool Inside(std::span<const ByteRange> ranges, size_t b, size_t e) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), b, [](size_t x, const ByteRange& r) { return x < r.begin; });
  if (it == ranges.begin()) return false;
  --it;
  return b >= it->begin && e <= it->end;
}

// Cuts `text` at occurrences of special-token texts, longest texts first, leftmost
// non-overlapping occurrences within each remaining raw run (llama.cpp's st_partition
// without the per-model lstrip/rstrip attributes). Control (and unknown) tokens are cut
// only with parse_special, and then, if `allowed` is given, only where the occurrence
// lies inside one of its ranges; a refused occurrence stays raw text and the search goes
// on from its next byte.
std::vector<Fragment> Partition(const Vocab& v, std::string_view text, bool parse_special,
                                const std::span<const ByteRange>* allowed = nullptr) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : v.special_tokens) {
    const auto& t = v.tokens[id];
    const bool control = t.attr & (kAttrControl | kAttrUnknown);
    if (!parse_special && control) continue;
    const bool restricted = control && allowed != nullptr;
    const std::string_view st = t.text;
    if (st.empty() || text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.len;
      const std::string_view window = text.substr(0, end);
      size_t emit = f.offset;    // start of the raw text not yet pushed
      size_t search = f.offset;  // where the next occurrence may start
      for (size_t m; (m = window.find(st, search)) != std::string_view::npos;) {
        if (restricted && !Inside(*allowed, m, m + st.size())) {
          search = m + 1;
          continue;
        }
        if (m > emit) next.push_back({-1, emit, m - emit});
        next.push_back({id, m, st.size()});
        emit = search = m + st.size();
      }
      if (emit < end) next.push_back({-1, emit, end - emit});
    }
    frags.swap(next);
  }
  return frags;
}

// Ids of `frags` (from Partition over `text`), with BOS/EOS as Encode.
std::vector<int32_t> EncodeFragments(const Vocab& v, std::string_view text, const std::vector<Fragment>& frags,
                                     bool add_bos) {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && v.add_bos && v.bos >= 0) out.push_back(v.bos);
  bool after_special = true;  // SPM: the start counts as "after a special token"
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view run = text.substr(f.offset, f.len);
    if (v.kind == TokenizerKind::kSpm) {
      tokenizer_internal::EncodeSpm(v, run, v.add_space_prefix && after_special, &out);
    } else {
      tokenizer_internal::EncodeBpe(v, run, &out);
    }
    after_special = false;
  }
  if (add_bos && v.add_eos && v.eos >= 0) out.push_back(v.eos);
  return out;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<const Vocab> vocab) : vocab_(std::move(vocab)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  auto v = std::make_unique<Vocab>();
  TRELLIS_RETURN_IF_ERROR(LoadModelKind(gguf, v.get()));
  TRELLIS_RETURN_IF_ERROR(LoadTokens(gguf, v.get()));
  if (v->kind == TokenizerKind::kBpe) TRELLIS_RETURN_IF_ERROR(LoadMerges(gguf, v.get()));

  const int32_t n = static_cast<int32_t>(v->tokens.size());
  int32_t fim_pad = -1, fim_rep = -1, fim_sep = -1;
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.bos_token_id", n, &v->bos));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.eos_token_id", n, &v->eos));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.eot_token_id", n, &v->eot));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.eom_token_id", n, &v->eom));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.unknown_token_id", n, &v->unk));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.seperator_token_id", n, &v->sep));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.padding_token_id", n, &v->pad));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.fim_pad_token_id", n, &fim_pad));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.fim_rep_token_id", n, &fim_rep));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalId(gguf, "tokenizer.ggml.fim_sep_token_id", n, &fim_sep));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalBool(gguf, "tokenizer.ggml.add_bos_token", &v->add_bos));
  TRELLIS_RETURN_IF_ERROR(ReadOptionalBool(gguf, "tokenizer.ggml.add_eos_token", &v->add_eos));

  DetectRole(v.get(), kEotTexts, &v->eot);
  DetectRole(v.get(), kEomTexts, &v->eom);
  DetectRole(v.get(), kFimPadTexts, &fim_pad);
  DetectRole(v.get(), kFimRepTexts, &fim_rep);
  DetectRole(v.get(), kFimSepTexts, &fim_sep);
  MarkEog(v.get(), fim_pad, fim_rep, fim_sep);
  BuildCaches(v.get());
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(v)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos, bool parse_special) const {
  return EncodeFragments(*vocab_, text, Partition(*vocab_, text, parse_special), add_bos);
}

std::vector<int32_t> Tokenizer::EncodeWithSpecialRanges(std::string_view text, bool add_bos,
                                                        std::span<const ByteRange> special) const {
  return EncodeFragments(*vocab_, text, Partition(*vocab_, text, /*parse_special=*/true, &special), add_bos);
}

size_t Tokenizer::max_token_bytes() const {
  size_t n = 4;
  for (const std::string& p : vocab_->pieces) n = std::max(n, p.size());
  return n;
}

std::string Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= n_vocab()) return std::string();
  if (!render_special && (vocab_->tokens[id].attr & (kAttrUnknown | kAttrControl))) return std::string();
  return vocab_->pieces[id];
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  const Vocab& v = *vocab_;
  std::string text;
  bool strip_space = v.add_space_prefix;
  for (int32_t id : ids) {
    std::string_view piece;
    if (id >= 0 && id < n_vocab() &&
        (render_special || !(v.tokens[id].attr & (kAttrUnknown | kAttrControl)))) {
      piece = v.pieces[id];
    }
    if (strip_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    strip_space = false;
    text.append(piece);
  }
  return v.clean_spaces ? CleanSpaces(text) : text;
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(vocab_->tokens.size()); }
int32_t Tokenizer::bos_id() const { return vocab_->bos; }
int32_t Tokenizer::eos_id() const { return vocab_->eos; }
int32_t Tokenizer::eot_id() const { return vocab_->eot; }
int32_t Tokenizer::unk_id() const { return vocab_->unk; }
int32_t Tokenizer::pad_id() const { return vocab_->pad; }
bool Tokenizer::IsEog(int32_t id) const { return id >= 0 && id < n_vocab() && vocab_->tokens[id].eog; }
bool Tokenizer::add_bos() const { return vocab_->add_bos && vocab_->bos >= 0; }
bool Tokenizer::add_space_prefix() const { return vocab_->add_space_prefix; }
TokenizerKind Tokenizer::kind() const { return vocab_->kind; }

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return std::string_view();
  return vocab_->tokens[id].text;
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const { return vocab_->Find(text); }

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool render_special)
    : tok_(tok), render_special_(render_special) {}

std::string StreamDecoder::Push(int32_t id) {
  pending_ += tok_.TokenToPiece(id, render_special_ || std::binary_search(rendered_.begin(), rendered_.end(), id));
  return Drain(/*at_end=*/false);
}

std::string StreamDecoder::Flush() { return Drain(/*at_end=*/true); }

std::string StreamDecoder::Drain(bool at_end) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(pending_.size());
  const std::string_view bytes = pending_;
  size_t i = 0;
  while (i < bytes.size()) {
    const int r = CheckUtf8Sequence(bytes.substr(i));
    if (r > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(r)));
      i += static_cast<size_t>(r);
    } else if (r == 0) {  // incomplete tail
      if (!at_end) break;
      out.append(kReplacement);
      i = bytes.size();
    } else {
      out.append(kReplacement);
      i += static_cast<size_t>(-r);
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace trellis
