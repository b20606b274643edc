#include "constrain/token_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "text/tokenizer.h"

namespace dspark::constrain {
namespace {

// A hand-made vocabulary over JSON pieces. Id 8 stands for the end of sequence (no bytes).
constexpr int32_t kEnd = 8;
std::shared_ptr<const TokenVocabulary> small_vocabulary() {
  std::vector<std::optional<std::string>> bytes = {
      "{",           // 0
      "}",           // 1
      "\"",          // 2
      "a",           // 3
      "\": ",        // 4
      "1",           // 5
      "{\"a\": 1}",  // 6
      "",            // 7: adds nothing, never allowed
      std::nullopt,  // 8: end of sequence
      "{}",          // 9
      "x",           // 10
      "\xc3",        // 11: first byte of U+00E9
      "\xa9",        // 12: its second byte
      ", ",          // 13
      " ",           // 14
      "a",           // 15: the same bytes as 3
      std::nullopt,  // 16: a special token that is not an end
  };
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

std::vector<int32_t> allowed_ids(const TokenConstraint& constraint, int64_t vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab), 1.0f);
  constraint.mask_logits(logits.data(), vocab);
  std::vector<int32_t> ids;
  for (int64_t id = 0; id < vocab; ++id) {
    const float logit = logits[static_cast<size_t>(id)];
    if (std::isinf(logit)) {
      EXPECT_LT(logit, 0.0f);
    } else {
      EXPECT_EQ(logit, 1.0f) << "an allowed logit must keep its value";
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  return ids;
}

using Ids = std::vector<int32_t>;

TEST(TokenConstraint, AllowedSetsAlongAnAnswer) {
  TokenConstraint constraint(json_object_grammar(), small_vocabulary(), {kEnd});
  // Ids 17..19 lie beyond the vocabulary: the model's logits row may be longer.
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{0, 6, 9}));
  EXPECT_FALSE(constraint.complete());
  constraint.accept(0);
  // '"' opens a key, and so does '": ' (a key that starts with a colon and a space).
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{1, 2, 4}));
  constraint.accept(2);
  // Key characters (JSON punctuation too), an empty key with its colon, the first byte of a
  // two-byte character; never a lone continuation byte.
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{0, 1, 2, 3, 4, 5, 9, 10, 11, 13, 14, 15}));
  constraint.accept(11);
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{12}));
  constraint.accept(12);
  constraint.accept(4);
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{0, 2, 4, 5, 6, 9}));
  constraint.accept(5);
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{1, 5, 13}));
  EXPECT_FALSE(constraint.finished());
  constraint.accept(1);
  EXPECT_TRUE(constraint.complete());
  EXPECT_TRUE(constraint.finished());
  EXPECT_EQ(allowed_ids(constraint, 20), (Ids{kEnd}));
  constraint.accept(kEnd);
  EXPECT_TRUE(constraint.complete());
  EXPECT_TRUE(constraint.finished());
  EXPECT_EQ(allowed_ids(constraint, 20), Ids{});
  EXPECT_FALSE(constraint.allows(kEnd));
  EXPECT_THROW(constraint.accept(kEnd), Error);
}

TEST(TokenConstraint, RefusedTokensThrowAndLeaveTheState) {
  TokenConstraint constraint(json_object_grammar(), small_vocabulary(), {kEnd});
  for (const int32_t id : {1, 2, 7, kEnd, 16, 17, -1}) {
    EXPECT_FALSE(constraint.allows(id)) << id;
    EXPECT_THROW(constraint.accept(id), Error) << id;
  }
  constraint.accept(6);
  EXPECT_TRUE(constraint.complete());
  EXPECT_THROW(constraint.accept(13), Error);
  EXPECT_TRUE(constraint.allows(kEnd));
  constraint.accept(kEnd);
}

TEST(TokenConstraint, AllowsAgreesWithTheMaskWithOrWithoutAWalk) {
  const auto vocabulary = small_vocabulary();
  TokenConstraint walked(json_object_grammar(), vocabulary, {kEnd});
  TokenConstraint direct(json_object_grammar(), vocabulary, {kEnd});
  for (const int32_t next : {0, 2, 3, 15, 4, 2, 10, 2, 1}) {
    const Ids mask = allowed_ids(walked, vocabulary->size());
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      const bool in_mask = std::find(mask.begin(), mask.end(), id) != mask.end();
      EXPECT_EQ(walked.allows(id), in_mask) << id;
      // A fresh copy has no allowed set for its state yet: allows() checks the token alone.
      const TokenConstraint fresh = direct;
      EXPECT_EQ(fresh.allows(id), in_mask) << id;
    }
    walked.accept(next);
    direct.accept(next);
  }
  EXPECT_TRUE(walked.complete());
}

TEST(TokenConstraint, AVocabularyThatCannotContinueIsAnError) {
  // No token spells ": ", so after a key the answer cannot go on.
  const auto vocabulary = std::make_shared<const TokenVocabulary>(
      std::vector<std::optional<std::string>>{"{", "\"", "a", std::nullopt});
  TokenConstraint constraint(json_object_grammar(), vocabulary, {3});
  for (int32_t id : {0, 1, 2, 1}) constraint.accept(id);
  std::vector<float> logits(4, 0.0f);
  try {
    constraint.mask_logits(logits.data(), 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no token can continue"), std::string::npos) << e.what();
  }
}

TEST(TokenConstraint, CopiesAdvanceApart) {
  TokenConstraint constraint(json_object_grammar(), small_vocabulary(), {kEnd});
  constraint.accept(0);
  constraint.accept(2);
  const Ids in_string = allowed_ids(constraint, 17);
  TokenConstraint copy = constraint;
  copy.accept(3);
  copy.accept(15);
  // After more characters the string state is the same one: the same set comes back.
  EXPECT_EQ(allowed_ids(copy, 17), in_string);
  copy.accept(4);
  EXPECT_EQ(allowed_ids(copy, 17), (Ids{0, 2, 4, 5, 6, 9}));
  EXPECT_EQ(allowed_ids(constraint, 17), in_string);
}

TEST(TokenConstraint, SeveralEndIdsAndBadOnes) {
  TokenConstraint constraint(json_object_grammar(), small_vocabulary(), {kEnd, 16});
  constraint.accept(9);
  EXPECT_EQ(allowed_ids(constraint, 17), (Ids{kEnd, 16}));
  constraint.accept(16);
  EXPECT_TRUE(constraint.finished());
  EXPECT_THROW(TokenConstraint(json_object_grammar(), small_vocabulary(), {17}), Error);
  EXPECT_THROW(TokenConstraint(json_object_grammar(), small_vocabulary(), {-1}), Error);
}

TEST(TokenConstraint, ConstraintsOnOneVocabularyKeepTheirOwnEndIds) {
  const auto vocabulary = small_vocabulary();
  TokenConstraint first(json_object_grammar(), vocabulary, {kEnd});
  TokenConstraint second(json_object_grammar(), vocabulary, {16});
  first.accept(9);
  second.accept(9);
  // The second finds the first's allowed set in the vocabulary's cache.
  EXPECT_EQ(allowed_ids(first, 17), (Ids{kEnd}));
  EXPECT_EQ(allowed_ids(second, 17), (Ids{16}));
  EXPECT_FALSE(second.allows(kEnd));
  EXPECT_THROW(second.accept(kEnd), Error);
}

// Digits lead back to the same state inside a number while letters are refused: the walk must
// not take a subtree of plain bytes whole there.
TEST(TokenConstraint, PlainBytesThatDoNotAllLoop) {
  const auto vocabulary =
      std::make_shared<const TokenVocabulary>(std::vector<std::optional<std::string>>{
          "{\"a\": 12", "1", "12", "1a", "1}", "1, ", "a1", "}"});
  TokenConstraint constraint(json_object_grammar(), vocabulary, {});
  constraint.accept(0);
  EXPECT_EQ(allowed_ids(constraint, 8), (Ids{1, 2, 4, 5, 7}));
}

const Tokenizer& smollm2() {
  static const Tokenizer tokenizer =
      Tokenizer::from_file(std::string(DSPARK_PUBLIC_FIXTURES) + "/smollm2/tokenizer.json");
  return tokenizer;
}

// The ids whose bytes a matcher takes one by one, from `matcher`'s state: the walk's oracle.
Ids checked_one_by_one(const TokenVocabulary& vocabulary, const Matcher& matcher, int32_t end) {
  Ids ids;
  for (int32_t id = 0; id < vocabulary.size(); ++id) {
    const std::optional<std::string>& bytes = vocabulary.bytes(id);
    bool ok = id == end ? matcher.complete() : bytes && !bytes->empty();
    if (ok && id != end) {
      Matcher probe = matcher;
      ok = probe.advance(*bytes);
    }
    if (ok) ids.push_back(id);
  }
  return ids;
}

// A prefix as ids: the encoded text, then ByteLevel tokens given by their strings (encode()
// would repair a text that ends inside a character).
struct Prefix {
  Prefix(std::string text, std::vector<std::string> raw_tokens = {})  // NOLINT: implicit
      : text(std::move(text)), raw_tokens(std::move(raw_tokens)) {}
  std::string text;
  std::vector<std::string> raw_tokens;
};

void expect_walk_matches_check(const std::shared_ptr<const Grammar>& grammar,
                               const std::vector<Prefix>& prefixes) {
  const Tokenizer& tokenizer = smollm2();
  static const auto vocabulary = TokenVocabulary::from_tokenizer(smollm2());
  const int32_t end = *tokenizer.token_to_id("<|im_end|>");
  for (const Prefix& prefix : prefixes) {
    TokenConstraint constraint(grammar, vocabulary, {end});
    Matcher matcher(grammar);
    std::vector<int32_t> ids = tokenizer.encode(prefix.text, false);
    for (const std::string& token : prefix.raw_tokens) ids.push_back(*tokenizer.token_to_id(token));
    for (const int32_t id : ids) {
      constraint.accept(id);
      ASSERT_TRUE(matcher.advance(*vocabulary->bytes(id))) << prefix.text;
    }
    const Ids walked = allowed_ids(constraint, vocabulary->size());
    EXPECT_EQ(walked, checked_one_by_one(*vocabulary, matcher, end))
        << "after '" << prefix.text << "' + " << prefix.raw_tokens.size() << " raw tokens";
    EXPECT_FALSE(walked.empty()) << prefix.text;
  }
}

// On a real vocabulary the trie walk gives exactly the ids whose bytes a matcher takes one by
// one: inside keys, strings, escapes, numbers, partial characters and between members.
TEST(TokenConstraint, TrieWalkMatchesTokenByTokenCheck) {
  // '\xc3\xa4' and '\xc2\xb8' stand for bytes 0xE4 0xB8, the first two of U+4E2D.
  expect_walk_matches_check(json_object_grammar(), {{""},
                                                    {"{\""},
                                                    {"{\"name\": "},
                                                    {"{\"name\": \"Ad"},
                                                    {"{\"name\": \"x\\"},
                                                    {"{\"name\": \"x\\u00"},
                                                    {"{\"name\": \"", {"\xc3\xa4", "\xc2\xb8"}},
                                                    {"{\"n\": -12"},
                                                    {"{\"n\": 1.5e"},
                                                    {"{\"n\": [true, "},
                                                    {"{\"n\": {\"m\": null}"}});
}

// Where plain characters do not lead back to the same state (a string that counts its length,
// a fixed set of strings), the walk cannot take whole subtrees at once.
TEST(TokenConstraint, TrieWalkMatchesTokenByTokenCheckInCountedStrings) {
  const auto schema = nlohmann::json::parse(R"({
    "type": "object",
    "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 5},
                   "kind": {"enum": ["alpha", "alps", "beta"]}},
    "required": ["code", "kind"]})");
  expect_walk_matches_check(json_schema_grammar(schema), {{"{\"code\": \""},
                                                          {"{\"code\": \"ab"},
                                                          {"{\"code\": \"abcd"},
                                                          {"{\"code\": \"ab\", \"kind\": "},
                                                          {"{\"code\": \"ab\", \"kind\": \"al"}});
}

TEST(TokenVocabulary, FromTokenizerLeavesOutSpecialAndMarkupTokens) {
  const Tokenizer qwen3 =
      Tokenizer::from_file(std::string(DSPARK_PUBLIC_FIXTURES) + "/qwen3/tokenizer.json");
  const auto vocabulary = TokenVocabulary::from_tokenizer(qwen3);
  EXPECT_EQ(vocabulary->size(), qwen3.vocab_size());
  EXPECT_FALSE(vocabulary->bytes(*qwen3.token_to_id("<|im_end|>")));
  // Not special in Qwen3's tokenizer.json, but markup the tool-call parser looks for.
  ASSERT_FALSE(qwen3.is_special(*qwen3.token_to_id("<tool_call>")));
  EXPECT_FALSE(vocabulary->bytes(*qwen3.token_to_id("<tool_call>")));
  EXPECT_EQ(vocabulary->bytes(*qwen3.token_to_id("\xc4\xa0world")), " world");
  EXPECT_THROW(vocabulary->bytes(qwen3.vocab_size()), Error);
}

}  // namespace
}  // namespace dspark::constrain
