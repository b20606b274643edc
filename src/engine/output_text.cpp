#include "engine/output_text.h"

namespace dspark {

OutputText::OutputText(const Tokenizer& tokenizer, bool skip_special_tokens,
                       const std::vector<std::string>& kept_special,
                       const std::vector<std::string>& stops)
    : detokenizer_(tokenizer, skip_special_tokens, kept_special), stops_(stops) {
  for (const std::string& stop : stops) {
    const auto id = tokenizer.token_to_id(stop);
    if (id && tokenizer.is_special(*id)) special_stops_.emplace(*id, stop);
  }
}

OutputText::Step OutputText::push(int32_t id, bool stops_armed) {
  Step step;
  step.decoded = detokenizer_.push(id);
  const auto special_stop =
      stops_armed && detokenizer_.skips(id) ? special_stops_.find(id) : special_stops_.end();
  if (special_stop == special_stops_.end()) {
    step.shown = stops_.push(step.decoded, stops_armed);
    return step;
  }
  // Nothing follows the stop: a character still unfinished goes out as it would at the end.
  step.decoded += detokenizer_.flush();
  step.shown = stops_.push(step.decoded);
  if (!step.shown.stopped) {
    step.shown.emit += stops_.flush();
    step.shown.stopped = true;
    step.shown.matched = special_stop->second;
  }
  return step;
}

std::string OutputText::finish() {
  return stops_.push(detokenizer_.flush()).emit + stops_.flush();
}

}  // namespace dspark
