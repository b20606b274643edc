#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "text/bpe.h"
#include "text/detokenizer.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_post_processor.h"
#include "text/utf8.h"

namespace dspark {
namespace {

// tokenizer_config.json names special tokens either as strings or as {"content": ...} objects.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const auto& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content")) return value.at("content").get<std::string>();
  return std::nullopt;
}

nlohmann::ordered_json ordered(const nlohmann::json& value) {
  return nlohmann::ordered_json::parse(value.dump());
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  Tokenizer tokenizer = from_json(read_file(tokenizer_json_path), tokenizer_json_path);
  const auto config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(read_file(config_path.string()));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
    if (const auto bos = config_token(config, "bos_token"))
      tokenizer.bos_id_ = tokenizer.token_to_id(*bos);
    if (const auto eos = config_token(config, "eos_token"))
      tokenizer.eos_id_ = tokenizer.token_to_id(*eos);
  }
  return tokenizer;
}

Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view source) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", source, e.what());
  }
  try {
    return from_document(document, source);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: unexpected tokenizer.json layout: {}", source, e.what());
  }
}

Tokenizer Tokenizer::from_document(const nlohmann::json& document, std::string_view source) {
  Tokenizer tokenizer;
  auto component = [&](const char* key) {
    return std::make_unique<nlohmann::json>(document.contains(key) ? document.at(key)
                                                                   : nlohmann::json(nullptr));
  };
  tokenizer.model_ = BpeModel::from_json(document.at("model"), source);
  tokenizer.normalizer_spec_ = component("normalizer");
  tokenizer.pre_tokenizer_spec_ = component("pre_tokenizer");
  tokenizer.post_processor_spec_ = component("post_processor");
  tokenizer.decoder_spec_ = component("decoder");
  tokenizer.normalizer_ = Normalizer::from_json(*tokenizer.normalizer_spec_, source);
  tokenizer.pre_tokenizer_ = PreTokenizer::from_json(*tokenizer.pre_tokenizer_spec_, source);
  tokenizer.decoder_ = Detokenizer::from_json(*tokenizer.decoder_spec_, source);
  tokenizer.post_processor_ =
      std::make_unique<PostProcessor>(*tokenizer.post_processor_spec_, source);

  if (document.contains("added_tokens")) {
    for (const auto& entry : document.at("added_tokens")) {
      AddedToken token;
      token.id = json_token_id(entry.at("id"), "added token id", source);
      token.content = entry.at("content").get<std::string>();
      token.single_word = entry.value("single_word", false);
      token.lstrip = entry.value("lstrip", false);
      token.rstrip = entry.value("rstrip", false);
      token.special = entry.value("special", false);
      token.normalized = entry.value("normalized", !token.special);
      if (token.id < 0) fail("{}: added token '{}' has negative id", source, token.content);
      if (token.content.empty()) continue;
      if (!utf8_is_valid(token.content)) {
        fail("{}: added token {} is not valid UTF-8", source, token.id);
      }
      token.decoded = token.normalized && tokenizer.normalizer_
                          ? tokenizer.normalizer_->normalize(token.content)
                          : token.content;
      tokenizer.added_by_id_[token.id] = tokenizer.added_tokens_.size();
      tokenizer.added_by_content_[token.content] = token.id;
      tokenizer.added_tokens_.push_back(std::move(token));
    }
  }
  // HF builds its matchers from the special tokens first, then the others.
  std::vector<const AddedToken*> ordered_tokens;
  for (const AddedToken& token : tokenizer.added_tokens_) {
    if (token.special) ordered_tokens.push_back(&token);
  }
  for (const AddedToken& token : tokenizer.added_tokens_) {
    if (!token.special) ordered_tokens.push_back(&token);
  }
  std::vector<AddedTokenMatcher::Pattern> raw;
  std::vector<AddedTokenMatcher::Pattern> normalized;
  for (const AddedToken* token : ordered_tokens) {
    if (!token->normalized) {
      raw.push_back({token->content, token});
    } else {
      normalized.push_back({token->decoded, token});
    }
  }
  tokenizer.raw_matcher_ = std::make_unique<AddedTokenMatcher>(raw);
  tokenizer.normalized_matcher_ = std::make_unique<AddedTokenMatcher>(normalized);
  return tokenizer;
}

namespace {

// Removes the content marks: a doubled mark stands for one U+FDD0 of the content; a single one
// is dropped and its offset in the result appended to `plain_starts` (when given).
std::string unmark(std::string_view text, std::vector<size_t>* plain_starts) {
  const std::string_view mark = Tokenizer::kContentMark;
  std::string clean;
  clean.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, mark.size(), mark) != 0) {
      clean += text[i++];
      continue;
    }
    i += mark.size();
    if (text.compare(i, mark.size(), mark) == 0) {
      clean += mark;
      i += mark.size();
    } else if (plain_starts != nullptr) {
      plain_starts->push_back(clean.size());
    }
  }
  return clean;
}

}  // namespace

std::string Tokenizer::mark_special_tokens(std::string_view content) const {
  std::vector<TextSegment> segments;
  if (!raw_matcher_->empty()) raw_matcher_->split(content, segments);
  std::vector<size_t> special_starts;
  for (const TextSegment& segment : segments) {
    if (segment.added_id < 0) continue;
    const AddedToken& token = added_tokens_[added_by_id_.at(segment.added_id)];
    if (!token.special) continue;
    // The segment may include whitespace an lstrip token absorbs; the mark goes where the
    // token's text starts.
    const size_t start = content.find(token.content, segment.begin);
    if (start != std::string_view::npos) special_starts.push_back(start);
  }
  const std::string_view mark = kContentMark;
  std::string marked;
  marked.reserve(content.size() + special_starts.size() * mark.size());
  size_t next_special = 0;
  for (size_t i = 0; i < content.size(); ++i) {
    if (next_special < special_starts.size() && special_starts[next_special] == i) {
      marked += mark;
      ++next_special;
    }
    if (content.compare(i, mark.size(), mark) == 0) marked += mark;
    marked += content[i];
  }
  return marked;
}

std::string Tokenizer::strip_content_marks(std::string_view text) {
  return unmark(text, nullptr);
}

std::vector<int32_t> Tokenizer::encode_marked(std::string_view text,
                                              bool add_special_tokens) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_repair(text);
    text = repaired;
  }
  std::vector<size_t> plain_starts;
  const std::string clean = unmark(text, &plain_starts);
  return encode_with_plain_starts(clean, add_special_tokens, plain_starts);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return encode_with_plain_starts(text, add_special_tokens, {});
}

std::vector<int32_t> Tokenizer::encode_with_plain_starts(
    std::string_view text, bool add_special_tokens, const std::vector<size_t>& plain_starts) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_repair(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<TextSegment> segments;
  if (raw_matcher_->empty()) {
    segments.push_back({0, text.size(), -1});
  } else {
    raw_matcher_->split(text, segments, plain_starts);
  }
  for (const TextSegment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
    } else {
      encode_text(text.substr(segment.begin, segment.end - segment.begin), segment.begin == 0, ids);
    }
  }
  if (add_special_tokens) post_processor_->add_special_tokens(ids);
  return ids;
}

void Tokenizer::encode_text(std::string_view text, bool at_input_start,
                            std::vector<int32_t>& ids) const {
  std::string normalized_text;
  if (normalizer_) {
    normalized_text = normalizer_->normalize(text);
    text = normalized_text;
  }
  std::vector<TextSegment> segments;
  if (normalized_matcher_->empty()) {
    segments.push_back({0, text.size(), -1});
  } else {
    normalized_matcher_->split(text, segments);
  }
  std::vector<PreToken> pieces;
  for (const TextSegment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    if (segment.begin == segment.end) continue;
    pieces.clear();
    pieces.push_back({std::string(text.substr(segment.begin, segment.end - segment.begin)),
                      at_input_start && segment.begin == 0});
    if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
    for (const PreToken& piece : pieces) model_->tokenize(piece.text, ids);
  }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      const AddedToken& token = added_tokens_[added->second];
      if (!(skip_special_tokens && token.special)) tokens.push_back(token.decoded);
      continue;
    }
    if (const std::string* token = model_->id_to_token(id)) tokens.push_back(*token);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  decoder_->decode_chain(tokens);
  std::string text;
  for (const std::string& piece : tokens) text += piece;
  return text;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto added = added_by_content_.find(std::string(token));
  if (added != added_by_content_.end()) return added->second;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const auto added = added_by_id_.find(id);
  if (added != added_by_id_.end()) return added_tokens_[added->second].decoded;
  if (const std::string* token = model_->id_to_token(id)) return *token;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const {
  int32_t limit = model_->id_limit();
  for (const AddedToken& token : added_tokens_) limit = std::max(limit, token.id + 1);
  return limit;
}

bool Tokenizer::is_special(int32_t id) const {
  const auto added = added_by_id_.find(id);
  return added != added_by_id_.end() && added_tokens_[added->second].special;
}

std::string Tokenizer::to_tokenizer_json() const {
  nlohmann::ordered_json document;
  document["version"] = "1.0";
  document["truncation"] = nullptr;
  document["padding"] = nullptr;
  std::vector<const AddedToken*> by_id;
  for (const AddedToken& token : added_tokens_) by_id.push_back(&token);
  std::sort(by_id.begin(), by_id.end(),
            [](const AddedToken* a, const AddedToken* b) { return a->id < b->id; });
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const AddedToken* token : by_id) {
    added.push_back({{"id", token->id},
                     {"content", token->content},
                     {"single_word", token->single_word},
                     {"lstrip", token->lstrip},
                     {"rstrip", token->rstrip},
                     {"normalized", token->normalized},
                     {"special", token->special}});
  }
  document["added_tokens"] = std::move(added);
  document["normalizer"] = ordered(*normalizer_spec_);
  document["pre_tokenizer"] = ordered(*pre_tokenizer_spec_);
  document["post_processor"] = ordered(*post_processor_spec_);
  document["decoder"] = ordered(*decoder_spec_);
  document["model"] = model_->to_json();
  return document.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
}

}  // namespace dspark
