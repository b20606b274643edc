#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "text/tokenizer.h"

namespace dspark {
namespace {

const std::string kSmollm2 = std::string(DSPARK_PUBLIC_FIXTURES) + "/smollm2/tokenizer.json";
const std::string kQwen3 = std::string(DSPARK_PUBLIC_FIXTURES) + "/qwen3/tokenizer.json";
const std::string kNemotronTiny =
    std::string(DSPARK_SOURCE_DIR) + "/tests/fixtures/nemotron-tiny/tokenizer.json";

// Texts whose tokens split multi-byte characters, spaces, digits and JSON punctuation.
const std::vector<std::string> kTexts = {
    R"({"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"]})",
    "  leading spaces and\ttabs\nnew lines\r\n",
    "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 12345.678e-9",
    "\xe4\xb8\xad\xe6\x96\x87\xe6\xb5\x8b\xe8\xaf\x95 \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 emoji",
    "<think>not special in every tokenizer</think> \\u00e9 \"quoted\"",
};

std::string joined_bytes(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  for (const int32_t id : ids) {
    const std::optional<std::string> bytes = tokenizer.token_bytes(id);
    EXPECT_TRUE(bytes.has_value()) << "id " << id;
    if (bytes) text += *bytes;
  }
  return text;
}

// For byte-level BPE the bytes of the tokens of a text are that text, byte for byte, whatever
// way the text was split.
void expect_tokens_spell_texts(const std::string& path) {
  const Tokenizer tokenizer = Tokenizer::from_file(path);
  for (const std::string& text : kTexts) {
    EXPECT_EQ(joined_bytes(tokenizer, tokenizer.encode(text, false)), text) << path;
  }
}

TEST(TokenBytes, ByteLevelTokensSpellTheText) {
  expect_tokens_spell_texts(kSmollm2);
  expect_tokens_spell_texts(kQwen3);
  expect_tokens_spell_texts(kNemotronTiny);
}

TEST(TokenBytes, ByteLevelMapsStandInCharacters) {
  const Tokenizer tokenizer = Tokenizer::from_file(kSmollm2);
  // "\xc4\xa0" is U+0120 'Ġ', GPT-2's stand-in for a space; "\xc4\x8a" (U+010A) for '\n'.
  const std::optional<int32_t> space_hello = tokenizer.token_to_id("\xc4\xa0hello");
  ASSERT_TRUE(space_hello);
  EXPECT_EQ(tokenizer.token_bytes(*space_hello), " hello");
  const std::optional<int32_t> newline = tokenizer.token_to_id("\xc4\x8a");
  ASSERT_TRUE(newline);
  EXPECT_EQ(tokenizer.token_bytes(*newline), "\n");
  // A lone lead byte of a multi-byte character: U+00E2 'â' stands for byte 0xE2.
  const std::optional<int32_t> lead = tokenizer.token_to_id("\xc3\xa2");
  ASSERT_TRUE(lead);
  EXPECT_EQ(tokenizer.token_bytes(*lead), std::string("\xe2"));
}

TEST(TokenBytes, SpecialAddedTokensHaveNone) {
  const Tokenizer smollm2 = Tokenizer::from_file(kSmollm2);
  EXPECT_FALSE(smollm2.token_bytes(*smollm2.token_to_id("<|im_end|>")));
  EXPECT_FALSE(smollm2.token_bytes(*smollm2.token_to_id("<|endoftext|>")));
  EXPECT_FALSE(smollm2.token_bytes(smollm2.vocab_size()));
  EXPECT_FALSE(smollm2.token_bytes(-1));
  // Nemotron's <think> is an added token that is not special: it is text.
  const Tokenizer nemotron = Tokenizer::from_file(kNemotronTiny);
  EXPECT_EQ(nemotron.token_bytes(*nemotron.token_to_id("<think>")), "<think>");
  EXPECT_FALSE(nemotron.token_bytes(*nemotron.token_to_id("<|im_start|>")));
}

// A SentencePiece-style BPE (Llama 2 layout): the decoder replaces the marker, then byte fallback.
constexpr const char* kSentencePieceJson = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 0, "content": "<unk>", "special": true},
    {"id": 1, "content": "<s>", "special": true},
    {"id": 2, "content": "</s>", "special": true}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
  "pre_tokenizer": null,
  "post_processor": null,
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "<0xE2>": 4, "<0x82>": 5, "<0xAC>": 6,
              "\u2581": 7, "t": 8, "h": 9, "e": 10, "\u2581t": 11, "he": 12, "\u2581the": 13},
    "merges": ["\u2581 t", "h e", "\u2581t he"]}
})";

TEST(TokenBytes, SentencePieceMarkerAndByteFallback) {
  const Tokenizer tokenizer = Tokenizer::from_json(kSentencePieceJson, "sentencepiece test");
  EXPECT_EQ(tokenizer.token_bytes(13), " the");
  EXPECT_EQ(tokenizer.token_bytes(7), " ");
  EXPECT_EQ(tokenizer.token_bytes(3), "A");
  EXPECT_EQ(tokenizer.token_bytes(4), std::string("\xe2"));
  EXPECT_FALSE(tokenizer.token_bytes(1));
  // The euro sign has no token: byte fallback spells it, and the bytes join to the text (with
  // the marker the normalizer prepended).
  const std::vector<int32_t> ids = tokenizer.encode("the \xe2\x82\xac", false);
  EXPECT_EQ(joined_bytes(tokenizer, ids), " the \xe2\x82\xac");
}

TEST(TokenBytes, MetaspaceDecoderGivesSpaceEvenFirst) {
  std::string json = kSentencePieceJson;
  const std::string decoder_start = R"("decoder": {)";
  const size_t begin = json.find(decoder_start);
  const size_t end = json.find(R"("model")");
  json.replace(begin, end - begin,
               R"("decoder": {"type": "Sequence", "decoders": [
                    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"},
                    {"type": "ByteFallback"}]},
                  )");
  const Tokenizer tokenizer = Tokenizer::from_json(json, "metaspace test");
  // decode() drops the first marker of a text; a token's bytes mid-text keep it as a space.
  EXPECT_EQ(tokenizer.token_bytes(13), " the");
  EXPECT_EQ(tokenizer.token_bytes(5), std::string("\x82"));
}

TEST(TokenBytes, RegexReplaceIsRefused) {
  std::string json = kSentencePieceJson;
  const std::string string_pattern = R"({"type": "Replace", "pattern": {"String": "\u2581"})";
  json.replace(json.find(string_pattern), string_pattern.size(),
               R"({"type": "Replace", "pattern": {"Regex": "\u2581"})");
  const Tokenizer tokenizer = Tokenizer::from_json(json, "regex replace test");
  EXPECT_THROW(tokenizer.token_bytes(13), Error);
}

}  // namespace
}  // namespace dspark
