#include "text/bpe.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/tokenizer_json.h"
#include "text/utf8.h"

namespace dspark {
namespace {

// Words longer than this are encoded without being cached; long ones rarely repeat.
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 1 << 17;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t length;  // bytes covered; 0 once merged into its left neighbour
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::push_heap keeps the largest on top; the next merge is the lowest rank, then leftmost.
  bool operator<(const QueuedMerge& other) const {
    if (rank != other.rank) return rank > other.rank;
    return pos > other.pos;
  }
};

struct MergeScratch {
  std::vector<Symbol> symbols;
  std::vector<QueuedMerge> queue;
};

MergeScratch& merge_scratch() {
  thread_local MergeScratch scratch;
  return scratch;
}

}  // namespace

// Open-addressing map from a pair of ids to (rank, merged id).
class BpeModel::MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t new_id = 0;
  };

  explicit MergeTable(size_t count) {
    size_t capacity = 16;
    while (capacity < count * 2) capacity <<= 1;
    entries_.resize(capacity);
    mask_ = capacity - 1;
  }

  // A later merge of the same pair replaces the earlier one, as in HF's map of merges.
  void insert(int32_t left, int32_t right, int32_t rank, int32_t new_id) {
    const uint64_t key = pair_key(left, right);
    for (size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      Entry& entry = entries_[slot];
      if (entry.key == kEmpty || entry.key == key) {
        entry = {key, rank, new_id};
        return;
      }
    }
  }

  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t slot = hash(key);; slot = (slot + 1) & mask_) {
      const Entry& entry = entries_[slot];
      if (entry.key == key) return &entry;
      if (entry.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t hash(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
};

BpeModel::BpeModel(std::vector<std::pair<std::string, int32_t>> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, std::string_view source)
    : options_(std::move(options)) {
  int32_t limit = 0;
  for (const auto& [token, id] : vocab) {
    if (id < 0) fail("{}: vocabulary token '{}' has negative id {}", source, token, id);
    limit = std::max(limit, id + 1);
  }
  id_to_token_.resize(limit);
  id_present_.assign(limit, 0);
  char_ids_.assign(0x10000, -1);
  token_to_id_.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    char32_t code_point;
    if (!token.empty() && utf8_decode(token, 0, &code_point) == token.size() &&
        code_point < 0x10000) {
      char_ids_[code_point] = id;
    }
    id_to_token_[id] = token;
    id_present_[id] = 1;
    token_to_id_[std::move(token)] = id;
  }

  merges_ = std::make_unique<MergeTable>(merges.size());
  merge_pairs_.reserve(merges.size());
  const size_t prefix_length = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto left_id = token_to_id(left);
    const auto right_id = token_to_id(right);
    if (!left_id || !right_id) {
      fail("{}: merge #{} '{} {}' uses a token missing from the vocabulary", source, rank, left,
           right);
    }
    std::string merged = left;
    if (prefix_length > 0 &&
        right.compare(0, prefix_length, options_.continuing_subword_prefix) == 0) {
      merged += right.substr(prefix_length);
    } else {
      merged += right;
    }
    const auto merged_id = token_to_id(merged);
    if (!merged_id) {
      fail("{}: merge #{} '{} {}' makes '{}', which is missing from the vocabulary", source, rank,
           left, right, merged);
    }
    merges_->insert(*left_id, *right_id, static_cast<int32_t>(rank), *merged_id);
    merge_pairs_.emplace_back(*left_id, *right_id);
  }

  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    if (!unk_id_) fail("{}: unk_token '{}' is not in the vocabulary", source, *options_.unk_token);
  }
  if (options_.byte_fallback) {
    byte_ids_.assign(256, -1);
    for (int byte = 0; byte < 256; ++byte) {
      if (const auto id = token_to_id(fmt::format("<0x{:02X}>", byte))) byte_ids_[byte] = *id;
    }
  }
}

BpeModel::~BpeModel() = default;

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& spec, std::string_view source) {
  const std::string type = spec.value("type", std::string("BPE"));
  if (type != "BPE") fail("{}: unsupported model type '{}' (only BPE)", source, type);
  if (spec.contains("dropout") && !spec.at("dropout").is_null() &&
      spec.at("dropout").get<double>() != 0.0) {
    fail("{}: BPE dropout is not supported", source);
  }
  auto optional_string = [&](const char* key) -> std::optional<std::string> {
    if (!spec.contains(key) || spec.at(key).is_null()) return std::nullopt;
    return spec.at(key).get<std::string>();
  };
  BpeOptions options;
  options.unk_token = optional_string("unk_token");
  options.continuing_subword_prefix = optional_string("continuing_subword_prefix").value_or("");
  options.end_of_word_suffix = optional_string("end_of_word_suffix").value_or("");
  options.fuse_unk = spec.value("fuse_unk", false);
  options.byte_fallback = spec.value("byte_fallback", false);
  options.ignore_merges = spec.value("ignore_merges", false);

  std::vector<std::pair<std::string, int32_t>> vocab;
  const auto& vocab_json = spec.at("vocab");
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    if (!is_token_id(id)) {
      fail("{}: vocab entry '{}' has id {}, not an integer in [0, {})", source, token, id.dump(),
           kMaxTokenIds);
    }
    vocab.emplace_back(token, static_cast<int32_t>(id.get<int64_t>()));
  }

  std::vector<std::pair<std::string, std::string>> merges;
  const auto& merges_json = spec.at("merges");
  merges.reserve(merges_json.size());
  for (const auto& merge : merges_json) {
    if (merge.is_array() && merge.size() == 2) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    // The older format writes each merge as one string "left right".
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ', 1);
    if (space == std::string::npos) fail("{}: merge '{}' is not 'left right'", source, text);
    merges.emplace_back(text.substr(0, space), text.substr(space + 1));
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), source);
}

nlohmann::ordered_json BpeModel::to_json() const {
  nlohmann::ordered_json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = options_.unk_token ? nlohmann::ordered_json(*options_.unk_token) : nullptr;
  model["continuing_subword_prefix"] =
      options_.continuing_subword_prefix.empty()
          ? nlohmann::ordered_json(nullptr)
          : nlohmann::ordered_json(options_.continuing_subword_prefix);
  model["end_of_word_suffix"] = options_.end_of_word_suffix.empty()
                                    ? nlohmann::ordered_json(nullptr)
                                    : nlohmann::ordered_json(options_.end_of_word_suffix);
  model["fuse_unk"] = options_.fuse_unk;
  model["byte_fallback"] = options_.byte_fallback;
  model["ignore_merges"] = options_.ignore_merges;
  // Tokens are unique, so entries go straight into the ordered map's vector: its operator[]
  // searches linearly, which would make a 150k-token vocabulary quadratic.
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  auto& entries = static_cast<nlohmann::ordered_json::object_t::Container&>(
      vocab.get_ref<nlohmann::ordered_json::object_t&>());
  entries.reserve(token_to_id_.size());
  for (size_t id = 0; id < id_to_token_.size(); ++id) {
    if (id_present_[id]) entries.emplace_back(id_to_token_[id], id);
  }
  model["vocab"] = std::move(vocab);
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [left, right] : merge_pairs_) {
    merges.push_back({id_to_token_[left], id_to_token_[right]});
  }
  model["merges"] = std::move(merges);
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, ids);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  merge_word(word, ids);
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() < kMaxCacheEntries) {
    cache_.emplace(std::string(word), std::vector<int32_t>(ids.begin() + first, ids.end()));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  MergeScratch& scratch = merge_scratch();
  std::vector<Symbol>& symbols = scratch.symbols;
  symbols.clear();

  const bool plain =
      options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty();
  // Bytes of an unknown character waiting to become <unk>, so that a run of them can be fused.
  uint32_t pending_unknown = 0;
  auto add = [&](int32_t id, uint32_t length) {
    symbols.push_back({id, static_cast<int32_t>(symbols.size()) - 1, -1, length});
  };
  size_t pos = 0;
  while (pos < word.size()) {
    char32_t code_point = 0;
    size_t length = utf8_decode(word, pos, &code_point);
    const bool well_formed = length != 0;
    if (!well_formed) {
      length = std::min(utf8_sequence_length(static_cast<uint8_t>(word[pos])), word.size() - pos);
    }
    const bool first = pos == 0;
    const bool last = pos + length == word.size();
    std::optional<int32_t> id;
    std::string decorated;
    std::string_view piece = word.substr(pos, length);
    if (plain && well_formed && code_point < 0x10000) {
      if (char_ids_[code_point] >= 0) id = char_ids_[code_point];
    } else {
      if (!first) decorated = options_.continuing_subword_prefix;
      decorated += piece;
      if (last) decorated += options_.end_of_word_suffix;
      piece = decorated;
      id = token_to_id(piece);
    }
    if (id) {
      if (pending_unknown > 0) {
        add(*unk_id_, pending_unknown);
        pending_unknown = 0;
      }
      add(*id, static_cast<uint32_t>(length));
    } else {
      bool handled = false;
      if (options_.byte_fallback) {
        handled = std::all_of(piece.begin(), piece.end(),
                              [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; });
        if (handled) {
          for (const char c : piece) add(byte_ids_[static_cast<uint8_t>(c)], 1);
        }
      }
      if (!handled && unk_id_) {
        if (pending_unknown > 0 && options_.fuse_unk) {
          pending_unknown += static_cast<uint32_t>(length);
        } else {
          if (pending_unknown > 0) add(*unk_id_, pending_unknown);
          pending_unknown = static_cast<uint32_t>(length);
        }
      }
    }
    pos += length;
  }
  if (pending_unknown > 0) add(*unk_id_, pending_unknown);
  if (symbols.empty()) return;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) symbols[i].next = static_cast<int32_t>(i + 1);

  std::vector<QueuedMerge>& queue = scratch.queue;
  queue.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* merge = merges_->find(symbols[i].id, symbols[i + 1].id)) {
      queue.push_back({merge->rank, static_cast<int32_t>(i), merge->new_id});
    }
  }
  std::make_heap(queue.begin(), queue.end());
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const QueuedMerge top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.length == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    const auto* current = merges_->find(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;

    left.id = top.new_id;
    left.length += right.length;
    left.next = right.next;
    symbols[right_pos].length = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      if (const auto* merge = merges_->find(symbols[left.prev].id, left.id)) {
        queue.push_back({merge->rank, left.prev, merge->new_id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
    if (left.next >= 0) {
      if (const auto* merge = merges_->find(left.id, symbols[left.next].id)) {
        queue.push_back({merge->rank, top.pos, merge->new_id});
        std::push_heap(queue.begin(), queue.end());
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.length > 0) ids.push_back(symbol.id);
  }
}

}  // namespace dspark
