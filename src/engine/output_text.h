#pragma once
// The text a generation shows, token by token: decoded incrementally (special tokens left out,
// the output parser's markers excepted: text/detokenizer_stream.h), then cut at the first stop
// string (stop_strings.h). A stop string that spells a special token the text leaves out stops
// at that token, so `stop: ["<|im_start|>"]` still ends a turn the model tries to open.
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/stop_strings.h"
#include "text/detokenizer_stream.h"
#include "text/tokenizer.h"

namespace dspark {

class OutputText {
 public:
  OutputText(const Tokenizer& tokenizer, bool skip_special_tokens,
             const std::vector<std::string>& kept_special, const std::vector<std::string>& stops);

  struct Step {
    std::string decoded;              // the token's text, before stop strings
    StopStringMatcher::Result shown;  // what may be shown now, and whether a stop completed
  };
  // `stops_armed`: false while vLLM's min_tokens holds stop strings off (StopStringMatcher::push).
  Step push(int32_t id, bool stops_armed = true);
  // The end of a generation no stop ended: everything held back.
  std::string finish();

 private:
  StreamingDetokenizer detokenizer_;
  StopStringMatcher stops_;
  std::unordered_map<int32_t, std::string> special_stops_;  // by the special token they spell
};

}  // namespace dspark
