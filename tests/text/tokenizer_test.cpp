#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "text/detokenizer_stream.h"
#include "text/unicode_normalization.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace dspark {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

const std::string kQwen3 = std::string(DSPARK_PUBLIC_FIXTURES) + "/qwen3/tokenizer.json";
const std::string kNemotronTiny =
    std::string(DSPARK_SOURCE_DIR) + "/tests/fixtures/nemotron-tiny/tokenizer.json";

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = Tokenizer::from_file(kQwen3);
  return tokenizer;
}

const Tokenizer& nemotron_tiny() {
  static const Tokenizer tokenizer = Tokenizer::from_file(kNemotronTiny);
  return tokenizer;
}

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t found; (found = text.find(separator, start)) != std::string::npos;) {
    parts.push_back(text.substr(start, found - start));
    start = found + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

// llama.cpp's Qwen2 vocabulary test: each case of the .inp file (cases separated by
// "\n__ggml_vocab_test__\n", the file ending with a separator) against the ids on the matching
// line of the .out file. SOURCES.md records that HF's Qwen3 tokenizer.json gives these ids.
TEST(Tokenizer, Qwen3MatchesLlamaCppVocabVectors) {
  const std::string dir = std::string(DSPARK_PUBLIC_FIXTURES) + "/qwen3/llama.cpp-vocab-tests/";
  std::vector<std::string> inputs =
      split(read_file(dir + "ggml-vocab-qwen2.gguf.inp"), "\n__ggml_vocab_test__\n");
  ASSERT_EQ(inputs.back(), "");
  inputs.pop_back();
  std::vector<std::string> outputs = split(read_file(dir + "ggml-vocab-qwen2.gguf.out"), "\n");
  ASSERT_EQ(outputs.back(), "");
  outputs.pop_back();
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(inputs.size(), outputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int32_t> expected;
    std::istringstream line(outputs[i]);
    for (int32_t id; line >> id;) expected.push_back(id);
    EXPECT_EQ(qwen3().encode(inputs[i], false), expected) << "case " << i << ": " << inputs[i];
    EXPECT_EQ(qwen3().decode(expected, false), inputs[i]) << "case " << i;
  }
}

TEST(Tokenizer, SpecialAndNonSpecialAddedTokens) {
  const Tokenizer& tokenizer = nemotron_tiny();
  const std::string prompt = "<|im_start|>assistant\n<think>\nfine</think>done<|im_end|>";
  const std::vector<int32_t> ids = tokenizer.encode(prompt, true);
  ASSERT_GE(ids.size(), 6u);
  EXPECT_EQ(ids.front(), 10);
  EXPECT_EQ(ids.back(), 11);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 12), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), 13), ids.end());
  EXPECT_TRUE(tokenizer.is_special(11));
  EXPECT_FALSE(tokenizer.is_special(12));
  EXPECT_EQ(tokenizer.decode(ids, false), prompt);
  // Skipping special tokens keeps the non-special <think> tags the reasoning parser needs.
  EXPECT_EQ(tokenizer.decode(ids, true), "assistant\n<think>\nfine</think>done");
  EXPECT_EQ(tokenizer.token_to_id("<|im_end|>"), 11);
  EXPECT_EQ(tokenizer.id_to_token(13), "</think>");
  EXPECT_EQ(tokenizer.eos_id(), 11);  // from tokenizer_config.json beside tokenizer.json
  EXPECT_EQ(tokenizer.vocab_size(), 8000);
}

TEST(Tokenizer, InvalidUtf8IsRepairedBeforeEncoding) {
  const std::string invalid = "ab\xC3(\xFF\xE2\x82 z\xF0\x9F\x98";
  const std::string repaired = utf8_repair(invalid);
  EXPECT_EQ(repaired, "ab\xEF\xBF\xBD(\xEF\xBF\xBD\xEF\xBF\xBD z\xEF\xBF\xBD");
  EXPECT_EQ(qwen3().encode(invalid, false), qwen3().encode(repaired, false));
  EXPECT_EQ(qwen3().decode(qwen3().encode(invalid, false), false), repaired);
  const std::string with_nul("a\0b", 3);
  EXPECT_EQ(qwen3().decode(qwen3().encode(with_nul, false), false), with_nul);
}

TEST(Tokenizer, DecodeSkipsIdsThatNameNoToken) {
  const std::vector<int32_t> hello = qwen3().encode("Hello", false);
  std::vector<int32_t> ids = {-5, 2000000000};
  ids.insert(ids.end(), hello.begin(), hello.end());
  ids.push_back(qwen3().vocab_size());
  EXPECT_EQ(qwen3().decode(ids, false), "Hello");
  EXPECT_FALSE(qwen3().id_to_token(-1).has_value());
  EXPECT_FALSE(qwen3().id_to_token(qwen3().vocab_size()).has_value());
}

TEST(Tokenizer, LoneByteTokensDecodeToReplacementCharacters) {
  // "Ã" is the byte-level stand-in for the single byte 0xC3: an unfinished character.
  const auto lead = qwen3().token_to_id("\xC3\x83");
  ASSERT_TRUE(lead.has_value());
  EXPECT_EQ(qwen3().decode({*lead}, false), "\xEF\xBF\xBD");
  EXPECT_EQ(qwen3().decode({*lead, *lead}, false), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, RandomBytesAndIdsNeverBreakIt) {
  std::mt19937 rng(7);
  for (const Tokenizer* tokenizer : {&qwen3(), &nemotron_tiny()}) {
    for (int round = 0; round < 500; ++round) {
      std::string bytes(rng() % 48, '\0');
      for (char& c : bytes) c = static_cast<char>(rng() % 256);
      const std::vector<int32_t> ids = tokenizer->encode(bytes, true);
      EXPECT_EQ(ids, tokenizer->encode(utf8_repair(bytes), true));
      EXPECT_TRUE(utf8_is_valid(tokenizer->decode(ids, false)));

      std::vector<int32_t> random_ids(rng() % 24);
      for (int32_t& id : random_ids)
        id = static_cast<int32_t>(rng() % (tokenizer->vocab_size() + 16)) - 8;
      const std::string text = tokenizer->decode(random_ids, round % 2 == 0);
      EXPECT_TRUE(utf8_is_valid(text));
      StreamingDetokenizer stream(*tokenizer, round % 2 == 0);
      std::string streamed;
      for (const int32_t id : random_ids) streamed += stream.push(id);
      streamed += stream.flush();
      EXPECT_EQ(streamed, text);
    }
  }
}

TEST(StreamingDetokenizer, NeverSplitsACharacterAndAddsUpToDecode) {
  const std::string text =
      "🦙 llamas 🇺🇸 中文没有空格 ½ Ελληνικά 👨‍👩‍👧‍👦 "
      "done\n<|im_end|>after";
  for (const Tokenizer* tokenizer : {&qwen3(), &nemotron_tiny()}) {
    const std::vector<int32_t> ids = tokenizer->encode(text, false);
    for (const bool skip : {false, true}) {
      StreamingDetokenizer stream(*tokenizer, skip);
      std::string joined;
      int held_back = 0;
      for (const int32_t id : ids) {
        const std::string chunk = stream.push(id);
        EXPECT_TRUE(utf8_is_valid(chunk)) << "chunk splits a character";
        if (chunk.empty()) ++held_back;
        joined += chunk;
      }
      const std::string rest = stream.flush();
      EXPECT_TRUE(utf8_is_valid(rest));
      joined += rest;
      EXPECT_EQ(joined, tokenizer->decode(ids, skip));
      EXPECT_GT(held_back, 0) << "the emoji are split over byte tokens, some pushes must wait";
    }
  }
}

TEST(StreamingDetokenizer, FlushReleasesAnUnfinishedCharacter) {
  const auto lead = qwen3().token_to_id("\xC3\x83");
  ASSERT_TRUE(lead.has_value());
  StreamingDetokenizer stream(qwen3(), false);
  EXPECT_EQ(stream.push(*qwen3().token_to_id("a")), "a");
  EXPECT_EQ(stream.push(*lead), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.push(*qwen3().token_to_id("b")), "b");
}

TEST(StreamingDetokenizer, SkipsSpecialTokensButTheParsersMarkers) {
  // Qwen3 with <think> and </think> marked special, as some tokenizers ship them.
  nlohmann::json document = nlohmann::json::parse(read_file(kQwen3));
  for (auto& token : document["added_tokens"]) {
    if (token["content"] == "<think>" || token["content"] == "</think>") token["special"] = true;
  }
  const Tokenizer tokenizer = Tokenizer::from_json(document.dump(), "qwen3 special think");
  const std::string text = "<think>plan<|im_start|></think>answer<|box_start|> done";
  const std::vector<int32_t> ids = tokenizer.encode(text, false);
  ASSERT_TRUE(tokenizer.is_special(*tokenizer.token_to_id("<think>")));
  const auto streamed = [&](bool skip, const std::vector<std::string>& kept) {
    StreamingDetokenizer stream(tokenizer, skip, kept);
    std::string joined;
    for (const int32_t id : ids) joined += stream.push(id);
    return joined + stream.flush();
  };
  EXPECT_EQ(streamed(false, {}), text);
  EXPECT_EQ(streamed(true, {}), "plananswer done");
  EXPECT_EQ(streamed(true, {}), tokenizer.decode(ids, true));
  EXPECT_EQ(streamed(true, {"<think>", "</think>", "<tool_call>", "not a token"}),
            "<think>plan</think>answer done");
}

TEST(Utf8, CompletePrefixStopsBeforeAnUnfinishedCharacter) {
  EXPECT_EQ(utf8_complete_prefix_length("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix_length("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(utf8_complete_prefix_length("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(utf8_complete_prefix_length("a\xC3"), 1u);
  EXPECT_EQ(utf8_complete_prefix_length("a\xFF"), 2u);  // never valid: nothing to wait for
  EXPECT_EQ(utf8_complete_prefix_length("a\xC0"), 2u);
  EXPECT_EQ(utf8_complete_prefix_length("\xE2\x82"), 0u);
}

TEST(Utf8, RepairFollowsMaximalSubparts) {
  // Python: b"\xe2\x82\xf0\x9f\x98A\xed\xa0\x80".decode("utf-8", "replace")
  EXPECT_EQ(utf8_repair("\xE2\x82\xF0\x9F\x98"
                        "A\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "A\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(utf8_is_valid("plain \xE4\xB8\xAD"));
  EXPECT_FALSE(utf8_is_valid("\xC0\x80"));
}

TEST(UnicodeRegex, WhitespaceMeansUnicodeWhiteSpaceAsInOniguruma) {
  const UnicodeRegex spaces(R"(\s+)");
  EXPECT_TRUE(spaces.search("\xC2\x85"));       // U+0085 NEXT LINE is White_Space
  EXPECT_FALSE(spaces.search("\xE1\xA0\x8E"));  // U+180E is not (PCRE2's \s says it is)
  EXPECT_TRUE(spaces.search("\xE3\x80\x80"));   // U+3000
  const UnicodeRegex not_space(R"([^\s\p{L}]+)");
  EXPECT_TRUE(not_space.search("\xE1\xA0\x8E"));
  EXPECT_FALSE(not_space.search("\xC2\x85"));
  std::vector<std::pair<size_t, size_t>> matches;
  UnicodeRegex(R"(\s+(?!\S)|\s+)").for_each_match("a   b", [&](size_t begin, size_t end) {
    matches.emplace_back(begin, end);
  });
  EXPECT_EQ(matches, (std::vector<std::pair<size_t, size_t>>{{1, 3}, {3, 4}}));
}

TEST(UnicodeRegex, BadPatternNamesItself) {
  try {
    UnicodeRegex regex("(unclosed");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos);
  }
}

TEST(UnicodeNormalization, UsesTheUnicode9TablesOfHfTokenizers) {
  EXPECT_EQ(unicode_normalize("e\xCC\x81", NormalizationForm::kNfc), "\xC3\xA9");
  EXPECT_EQ(unicode_normalize("\xC3\xA9", NormalizationForm::kNfd), "e\xCC\x81");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", NormalizationForm::kNfkc), "fi");
  // U+10F46 (Unicode 11, combining class 220) is left where it is, as HF does; full NFC would
  // move it before the U+0301 (class 230).
  const std::string newer = "x\xCC\x81\xF0\x90\xBD\x86";
  EXPECT_EQ(unicode_normalize(newer, NormalizationForm::kNfc), newer);
  EXPECT_EQ(unicode_lowercase("\xC3\x84PFEL \xCE\xA3\xCE\xA3"), "\xC3\xA4pfel \xCF\x83\xCF\x82");
}

TEST(Tokenizer, ErrorsNameTheSourceAndTheProblem) {
  auto message = [](const std::string& json) {
    try {
      Tokenizer::from_json(json, "test.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("test.json: invalid JSON"), std::string::npos);
  EXPECT_NE(message(R"({"model": {"type": "Unigram", "vocab": []}})").find("Unigram"),
            std::string::npos);
  EXPECT_NE(message(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}})")
                .find("merge #0"),
            std::string::npos);
  EXPECT_NE(message(R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
                       "pre_tokenizer": {"type": "BertPreTokenizer"}})")
                .find("unsupported pre_tokenizer type 'BertPreTokenizer'"),
            std::string::npos);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

GgufTokenizerData tiny_gguf() {
  GgufTokenizerData data;
  data.model = "gpt2";
  data.pre = "qwen2";
  data.tokens = {"a", "b", "ab", "\xC4\xA0", "<|end|>"};
  data.token_types = {1, 1, 1, 1, 3};
  data.merges = {"a b"};
  data.eos_id = 4;
  return data;
}

TEST(Tokenizer, FromGgufMetadata) {
  const Tokenizer tokenizer = Tokenizer::from_gguf_metadata(tiny_gguf());
  EXPECT_EQ(tokenizer.encode("ab ab<|end|>", false), (std::vector<int32_t>{2, 3, 2, 4}));
  EXPECT_EQ(tokenizer.decode({2, 3, 2, 4}, true), "ab ab");
  EXPECT_TRUE(tokenizer.is_special(4));
  EXPECT_EQ(tokenizer.eos_id(), 4);
  // Written out and read back, it is the same tokenizer.
  const Tokenizer reread = Tokenizer::from_json(tokenizer.to_tokenizer_json(), "rewritten");
  EXPECT_EQ(reread.encode("abab ba", false), tokenizer.encode("abab ba", false));
  const auto document = nlohmann::json::parse(tokenizer.to_tokenizer_json());
  EXPECT_EQ(document.at("normalizer").at("type"), "NFC");
  EXPECT_EQ(document.at("model").at("merges").at(0), (nlohmann::json{"a", "b"}));
}

TEST(Tokenizer, FromGgufMetadataRejectsWhatItCannotRepresent) {
  GgufTokenizerData data = tiny_gguf();
  data.model = "llama";
  EXPECT_THROW(Tokenizer::from_gguf_metadata(data), Error);
  data = tiny_gguf();
  data.pre = "no-such-pre";
  EXPECT_THROW(Tokenizer::from_gguf_metadata(data), Error);
  data = tiny_gguf();
  data.tokens[1] = "a";
  EXPECT_THROW(Tokenizer::from_gguf_metadata(data), Error);
  data = tiny_gguf();
  data.add_bos = true;  // but no bos id
  EXPECT_THROW(Tokenizer::from_gguf_metadata(data), Error);
  data = tiny_gguf();
  data.merges = {"ab"};
  EXPECT_THROW(Tokenizer::from_gguf_metadata(data), Error);
}

}  // namespace
}  // namespace dspark
