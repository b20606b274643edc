// Drives dspark's tokenizer for the oracle tests, in batch so that one process serves a whole
// corpus:
//   dspark_tool_tokenizer run <tokenizer.json> <request.json> <response.json>
//     request:  {"encode": [text...], "decode": [[id...]...], "stream": [[id...]...]}
//     response: {"vocab_size", "bos_id", "eos_id", "special_ids",
//                "ids": [[...]] (add_special_tokens=false), "ids_special": [[...]] (true),
//                "decode_skip": [...], "decode_keep": [...],
//                "stream_chunks": [[chunk...]...] (skip_special_tokens=false, ends with flush)}
//   dspark_tool_tokenizer rewrite <tokenizer.json> <out.json>      (load, then to_tokenizer_json)
//   dspark_tool_tokenizer gguf <gguf_fields.json> <out.json>
//     gguf_fields: {"model", "pre", "tokens", "token_types", "merges", "bos_id", "eos_id",
//                   "add_bos", "add_eos"} as a GGUF reader would fill GgufTokenizerData.
#include "text/tokenizer.h"

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "base/error.h"
#include "base/file_io.h"
#include "text/detokenizer_stream.h"

namespace {

using dspark::read_file;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) dspark::fail("cannot write {}", path);
}

nlohmann::json optional_id(const std::optional<int32_t>& id) {
  return id ? nlohmann::json(*id) : nlohmann::json(nullptr);
}

void run(const std::string& tokenizer_path, const std::string& request_path,
         const std::string& response_path) {
  const dspark::Tokenizer tokenizer = dspark::Tokenizer::from_file(tokenizer_path);
  const nlohmann::json request = nlohmann::json::parse(read_file(request_path));
  nlohmann::json response;
  response["vocab_size"] = tokenizer.vocab_size();
  response["bos_id"] = optional_id(tokenizer.bos_id());
  response["eos_id"] = optional_id(tokenizer.eos_id());
  nlohmann::json special_ids = nlohmann::json::array();
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.is_special(id)) special_ids.push_back(id);
  }
  response["special_ids"] = special_ids;

  nlohmann::json ids = nlohmann::json::array();
  nlohmann::json ids_special = nlohmann::json::array();
  for (const auto& text : request.value("encode", nlohmann::json::array())) {
    const std::string input = text.get<std::string>();
    ids.push_back(tokenizer.encode(input, false));
    ids_special.push_back(tokenizer.encode(input, true));
  }
  response["ids"] = std::move(ids);
  response["ids_special"] = std::move(ids_special);

  nlohmann::json decode_skip = nlohmann::json::array();
  nlohmann::json decode_keep = nlohmann::json::array();
  for (const auto& sequence : request.value("decode", nlohmann::json::array())) {
    const auto input = sequence.get<std::vector<int32_t>>();
    decode_skip.push_back(tokenizer.decode(input, true));
    decode_keep.push_back(tokenizer.decode(input, false));
  }
  response["decode_skip"] = std::move(decode_skip);
  response["decode_keep"] = std::move(decode_keep);

  nlohmann::json stream_chunks = nlohmann::json::array();
  for (const auto& sequence : request.value("stream", nlohmann::json::array())) {
    dspark::StreamingDetokenizer stream(tokenizer, false);
    nlohmann::json chunks = nlohmann::json::array();
    for (const auto& id : sequence) chunks.push_back(stream.push(id.get<int32_t>()));
    chunks.push_back(stream.flush());
    stream_chunks.push_back(std::move(chunks));
  }
  response["stream_chunks"] = std::move(stream_chunks);
  write_file(response_path, response.dump());
}

void gguf(const std::string& fields_path, const std::string& out_path) {
  const nlohmann::json fields = nlohmann::json::parse(read_file(fields_path));
  dspark::GgufTokenizerData data;
  data.model = fields.at("model").get<std::string>();
  data.pre = fields.at("pre").get<std::string>();
  data.tokens = fields.at("tokens").get<std::vector<std::string>>();
  data.token_types = fields.value("token_types", std::vector<int32_t>{});
  data.merges = fields.at("merges").get<std::vector<std::string>>();
  auto read_optional = [&](const char* key, auto& target) {
    if (fields.contains(key) && !fields.at(key).is_null()) {
      target = fields.at(key).get<typename std::decay_t<decltype(target)>::value_type>();
    }
  };
  read_optional("bos_id", data.bos_id);
  read_optional("eos_id", data.eos_id);
  read_optional("add_bos", data.add_bos);
  read_optional("add_eos", data.add_eos);
  write_file(out_path, dspark::Tokenizer::from_gguf_metadata(data).to_tokenizer_json());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "run" && argc == 5) {
      run(argv[2], argv[3], argv[4]);
    } else if (command == "rewrite" && argc == 4) {
      write_file(argv[3], dspark::Tokenizer::from_file(argv[2]).to_tokenizer_json());
    } else if (command == "gguf" && argc == 4) {
      gguf(argv[2], argv[3]);
    } else {
      std::cerr << "usage: dspark_tool_tokenizer run <tokenizer.json> <request> <response>\n"
                   "       dspark_tool_tokenizer rewrite <tokenizer.json> <out.json>\n"
                   "       dspark_tool_tokenizer gguf <gguf_fields.json> <out.json>\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "dspark_tool_tokenizer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
