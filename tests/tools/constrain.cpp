// Drives dspark's token constraint for the oracle test against llguidance:
//   dspark_tool_constrain <tokenizer.json> <request.json> <response.json>
//     request:  {"schema": <JSON schema> or null for any JSON object, "end_ids": [id...],
//                "sequences": [[id...]...]}
//     response: {"vocab_size", "sequences": [{"masks": [hex...], "complete": [bool...],
//                "rejected_at": k or null}...]}
// For a sequence of n ids there are n + 1 masks and complete flags: after 0..n ids were accepted.
// A mask is the allowed ids as a bitmap (bit i of byte i / 8 is id i, as numpy.packbits with
// bitorder "little"), in hex; it is read through mask_logits. rejected_at is the first id the
// constraint refused, where the sequence stops.
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "constrain/grammar.h"
#include "constrain/token_constraint.h"
#include "text/tokenizer.h"

namespace {

using dspark::constrain::TokenConstraint;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) dspark::fail("cannot write {}", path);
}

std::string mask_hex(const TokenConstraint& constraint, int32_t vocab_size) {
  std::vector<float> logits(static_cast<size_t>(vocab_size), 0.0f);
  constraint.mask_logits(logits.data(), vocab_size);
  std::vector<uint8_t> bits((static_cast<size_t>(vocab_size) + 7) / 8, 0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const bool allowed = !std::isinf(logits[static_cast<size_t>(id)]);
    if (allowed) bits[static_cast<size_t>(id) / 8] |= static_cast<uint8_t>(1u << (id % 8));
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bits.size() * 2);
  for (const uint8_t byte : bits) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 15]);
  }
  return hex;
}

void run(const std::string& tokenizer_path, const std::string& request_path,
         const std::string& response_path) {
  const dspark::Tokenizer tokenizer = dspark::Tokenizer::from_file(tokenizer_path);
  // Ordered: properties come in the order the schema lists them.
  const nlohmann::ordered_json request =
      nlohmann::ordered_json::parse(dspark::read_file(request_path));
  const auto vocabulary = dspark::constrain::TokenVocabulary::from_tokenizer(tokenizer);
  const auto grammar = request.at("schema").is_null()
                           ? dspark::constrain::json_object_grammar()
                           : dspark::constrain::json_schema_grammar(request.at("schema"));
  const auto end_ids = request.at("end_ids").get<std::vector<int32_t>>();
  const int32_t vocab_size = vocabulary->size();

  nlohmann::json sequences = nlohmann::json::array();
  for (const auto& sequence : request.at("sequences")) {
    const auto ids = sequence.get<std::vector<int32_t>>();
    TokenConstraint constraint(grammar, vocabulary, end_ids);
    nlohmann::json masks = nlohmann::json::array();
    nlohmann::json complete = nlohmann::json::array();
    nlohmann::json rejected_at = nullptr;
    for (size_t k = 0; k <= ids.size(); ++k) {
      masks.push_back(mask_hex(constraint, vocab_size));
      complete.push_back(constraint.complete());
      if (k == ids.size()) break;
      if (!constraint.allows(ids[k])) {
        rejected_at = k;
        break;
      }
      constraint.accept(ids[k]);
    }
    sequences.push_back({{"masks", std::move(masks)},
                         {"complete", std::move(complete)},
                         {"rejected_at", rejected_at}});
  }
  write_file(
      response_path,
      nlohmann::json{{"vocab_size", vocab_size}, {"sequences", std::move(sequences)}}.dump());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: dspark_tool_constrain <tokenizer.json> <request.json> <response.json>\n";
    return 2;
  }
  try {
    run(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::cerr << "dspark_tool_constrain: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
