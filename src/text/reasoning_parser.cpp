#include "text/reasoning_parser.h"

#include <algorithm>

namespace dspark {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Length of the longest suffix of `text` that is a proper prefix of `marker` (text that may turn
// into the marker once more arrives).
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length) {
    if (text.substr(text.size() - length) == marker.substr(0, length)) return length;
  }
  return 0;
}

}  // namespace

std::optional<ReasoningSyntax> detect_reasoning_syntax(std::string_view template_source) {
  if (template_source.find("<think>") == std::string_view::npos) return std::nullopt;
  return ReasoningSyntax{};
}

bool prompt_opens_reasoning(std::string_view prompt, const ReasoningSyntax& syntax) {
  const size_t start = prompt.rfind(syntax.start);
  if (start == std::string_view::npos) return false;
  const size_t end = prompt.rfind(syntax.end);
  return end == std::string_view::npos || start > end;
}

ReasoningParser::ReasoningParser(ReasoningSyntax syntax, bool starts_in_reasoning)
    : syntax_(std::move(syntax)),
      mode_(starts_in_reasoning ? Mode::kReasoning : Mode::kMaybeStart),
      at_reasoning_start_(starts_in_reasoning) {}

void ReasoningParser::feed(std::string_view chunk, Output& out) {
  buffer_ += chunk;
  process(false, out);
}

void ReasoningParser::finish(Output& out) {
  process(true, out);
}

// Reasoning loses its leading and trailing whitespace: a whitespace run is only emitted once
// more reasoning text follows it.
void ReasoningParser::emit_reasoning(std::string_view text, Output& out) {
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    if (reasoning_started_) pending_whitespace_ += text;
    return;
  }
  std::string_view head = text.substr(0, last);
  if (reasoning_started_) {
    out.reasoning += pending_whitespace_;
  } else {
    size_t first = 0;
    while (is_space(head[first])) ++first;
    head.remove_prefix(first);
  }
  out.reasoning += head;
  pending_whitespace_ = text.substr(last);
  reasoning_started_ = true;
}

void ReasoningParser::process(bool final, Output& out) {
  while (true) {
    if (mode_ == Mode::kContent) {
      out.content += buffer_;
      buffer_.clear();
      return;
    }
    if (mode_ == Mode::kMaybeStart || at_reasoning_start_) {
      size_t skip = 0;
      while (skip < buffer_.size() && is_space(buffer_[skip])) ++skip;
      const std::string_view rest = std::string_view(buffer_).substr(skip);
      if (rest.starts_with(syntax_.start)) {
        buffer_.erase(0, skip + syntax_.start.size());
        mode_ = Mode::kReasoning;
        at_reasoning_start_ = false;
        continue;
      }
      if (!final && rest.size() < syntax_.start.size() &&
          std::string_view(syntax_.start).starts_with(rest))
        return;
      if (mode_ == Mode::kMaybeStart) {
        mode_ = Mode::kContent;
      } else {
        at_reasoning_start_ = false;
      }
      continue;
    }
    // In reasoning: look for the end marker and for an implicit end.
    const size_t end = buffer_.find(syntax_.end);
    const bool has_implicit = !syntax_.implicit_end_marker.empty();
    size_t search_from = 0;
    size_t implicit = std::string::npos;
    while (has_implicit) {
      implicit = buffer_.find(syntax_.implicit_end_marker, search_from);
      if (implicit == std::string::npos || (end != std::string::npos && end < implicit)) {
        implicit = std::string::npos;
        break;
      }
      const MarkerMatch match = syntax_.implicit_end_check(
          std::string_view(buffer_).substr(implicit + syntax_.implicit_end_marker.size()), final);
      if (match == MarkerMatch::kYes) break;
      if (match == MarkerMatch::kNeedMore) {
        // Everything before the marker is reasoning either way; the rest waits.
        emit_reasoning(std::string_view(buffer_).substr(0, implicit), out);
        buffer_.erase(0, implicit);
        return;
      }
      search_from = implicit + syntax_.implicit_end_marker.size();
    }
    if (implicit != std::string::npos) {
      emit_reasoning(std::string_view(buffer_).substr(0, implicit), out);
      buffer_.erase(0, implicit);
      pending_whitespace_.clear();
      mode_ = Mode::kContent;
      continue;
    }
    if (end != std::string::npos) {
      emit_reasoning(std::string_view(buffer_).substr(0, end), out);
      buffer_.erase(0, end + syntax_.end.size());
      pending_whitespace_.clear();
      mode_ = Mode::kContent;
      continue;
    }
    size_t keep = 0;
    if (!final) {
      keep = partial_marker_suffix(buffer_, syntax_.end);
      if (has_implicit)
        keep = std::max(keep, partial_marker_suffix(buffer_, syntax_.implicit_end_marker));
    }
    emit_reasoning(std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
    buffer_.erase(0, buffer_.size() - keep);
    return;
  }
}

}  // namespace dspark
