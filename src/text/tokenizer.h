#pragma once
// Text <-> token ids with the exact behaviour of HF tokenizers for BPE tokenizer.json files
// (byte-level GPT-2/Llama 3/Qwen/Tekken style and SentencePiece-style with byte fallback):
// added tokens are found first, the rest is normalized, pre-tokenized and BPE-encoded, then the
// post-processor adds BOS/EOS when asked. A tokenizer can also be built from GGUF metadata and
// written back out as tokenizer.json.
//
// Bad input never crashes: invalid UTF-8 passed to encode is first repaired (each ill-formed
// subsequence becomes U+FFFD, as Python's errors="replace" would do before HF sees the text), and
// decode skips ids that name no token, as HF's decode does.
//
// encode and decode are const and safe to call from several threads at once.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_added_tokens.h"

namespace dspark {

class BpeModel;
class Normalizer;
class PreTokenizer;
class Detokenizer;
class PostProcessor;

// The tokenizer fields of a GGUF file (tokenizer.ggml.*), filled by the GGUF reader.
struct GgufTokenizerData {
  // GGUF token types (tokenizer.ggml.token_type).
  enum TokenType : int32_t {
    kUndefined = 0,
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6,
  };
  std::string model;                  // tokenizer.ggml.model; "gpt2" (byte-level BPE) is supported
  std::string pre;                    // tokenizer.ggml.pre, e.g. "qwen2", "llama-bpe", "smollm"
  std::vector<std::string> tokens;    // tokenizer.ggml.tokens, index = id
  std::vector<int32_t> token_types;   // tokenizer.ggml.token_type; empty means all normal
  std::vector<std::string> merges;    // tokenizer.ggml.merges, "left right" in rank order
  std::optional<int32_t> bos_id;      // tokenizer.ggml.bos_token_id
  std::optional<int32_t> eos_id;      // tokenizer.ggml.eos_token_id
  std::optional<int32_t> unknown_id;  // tokenizer.ggml.unknown_token_id
  std::optional<int32_t> padding_id;  // tokenizer.ggml.padding_token_id
  std::optional<bool> add_bos;        // tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos;        // tokenizer.ggml.add_eos_token
};

class Tokenizer {
 public:
  // Reads a tokenizer.json; bos/eos come from a tokenizer_config.json beside it when present.
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Parses tokenizer.json text; `source` names it in error messages.
  static Tokenizer from_json(std::string_view json_text, std::string_view source);
  static Tokenizer from_gguf_metadata(const GgufTokenizerData& data);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // Prompt injection guard for chat prompts: text from messages, tools and tool results must
  // never yield control tokens, only the chat template's own markup may. mark_special_tokens
  // puts kContentMark (U+FDD0, a noncharacter reserved for internal use) before every special
  // token in such text, and doubles any U+FDD0 already there; the rendered prompt then goes to
  // encode_marked, which drops the marks and keeps each marked special token plain text (tokenized
  // like any other text, exactly what HF gives with encode_special_tokens for that stretch).
  // Special tokens that match only after normalization (normalized: true) are not marked.
  static constexpr std::string_view kContentMark = "\xEF\xB7\x90";
  std::string mark_special_tokens(std::string_view content) const;
  std::vector<int32_t> encode_marked(std::string_view text, bool add_special_tokens) const;
  // The text encode_marked tokenizes: the marks removed (what a user should be shown).
  static std::string strip_content_marks(std::string_view text);
  // Ids that name no token are skipped; with skip_special_tokens, special added tokens are too.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  // One more than the largest token id (the rows an embedding table needs).
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  // Whether `id` is one of the tokenizer.json's added_tokens (special or not).
  bool is_added(int32_t id) const { return added_by_id_.count(id) != 0; }
  // The bytes token `id` adds to a decoded text when it stands between other tokens (ByteLevel
  // stand-in characters mapped back to bytes, <0xNN> byte-fallback tokens as their byte, the
  // Metaspace marker as a space); may be a partial UTF-8 character. Nullopt for special added
  // tokens and for ids that name no token.
  std::optional<std::string> token_bytes(int32_t id) const;
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }

  // A tokenizer.json equivalent to this tokenizer (HF tokenizers loads it to the same encodings).
  std::string to_tokenizer_json() const;

 private:
  Tokenizer();
  static Tokenizer from_document(const nlohmann::json& document, std::string_view source);
  void encode_text(std::string_view text, bool at_input_start, std::vector<int32_t>& ids) const;
  std::vector<int32_t> encode_with_plain_starts(std::string_view text, bool add_special_tokens,
                                                const std::vector<size_t>& plain_starts) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Detokenizer> decoder_;
  std::unique_ptr<PostProcessor> post_processor_;
  // The component descriptions as read, written back by to_tokenizer_json.
  std::unique_ptr<nlohmann::json> normalizer_spec_;
  std::unique_ptr<nlohmann::json> pre_tokenizer_spec_;
  std::unique_ptr<nlohmann::json> post_processor_spec_;
  std::unique_ptr<nlohmann::json> decoder_spec_;

  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_by_id_;  // id -> index in added_tokens_
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;         // tokens with normalized = false
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;  // tokens with normalized = true
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

}  // namespace dspark
