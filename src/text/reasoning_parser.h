#pragma once
// Splits generated text into reasoning and content, incrementally. Reasoning is the text inside
// <think>...</think>; the prompt may already have opened the block (the output then starts inside
// it), the model may repeat the opening tag (dropped), and with tool-calling models a real tool
// call inside an unclosed block ends the reasoning implicitly (the call belongs to the content).
// A marker split across chunks is held back until it is decided, so any chunking of the same
// text yields the same reasoning and content. Reasoning is trimmed of surrounding whitespace.
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace dspark {

// Whether the text after a marker makes it a real tool call: yes, no, or not decidable yet.
enum class MarkerMatch { kNo, kYes, kNeedMore };

struct ReasoningSyntax {
  std::string start = "<think>";
  std::string end = "</think>";
  // A tool-call opening marker that ends reasoning implicitly when `implicit_end_check` accepts
  // the text after it (given whether the text is final). Empty: no implicit end.
  std::string implicit_end_marker;
  std::function<MarkerMatch(std::string_view after_marker, bool final)> implicit_end_check;
};

// The <think> syntax when the template uses it (mentions "<think>"), else nullopt.
std::optional<ReasoningSyntax> detect_reasoning_syntax(std::string_view template_source);

// mlx-lm's rule: the prompt leaves reasoning open when its last start marker comes after its
// last end marker (e.g. a generation prompt ending in "<think>\n").
bool prompt_opens_reasoning(std::string_view prompt, const ReasoningSyntax& syntax);

class ReasoningParser {
 public:
  struct Output {
    std::string reasoning;
    std::string content;
  };

  ReasoningParser(ReasoningSyntax syntax, bool starts_in_reasoning);

  // Appends what `chunk` settles; within one call all reasoning precedes all content.
  void feed(std::string_view chunk, Output& out);
  // The end of the output: held-back text is settled.
  void finish(Output& out);

  bool in_reasoning() const { return mode_ != Mode::kContent; }

 private:
  enum class Mode { kMaybeStart, kReasoning, kContent };
  void process(bool final, Output& out);
  void emit_reasoning(std::string_view text, Output& out);

  ReasoningSyntax syntax_;
  Mode mode_;
  bool at_reasoning_start_;  // a repeated start marker is still droppable
  bool reasoning_started_ = false;
  std::string pending_whitespace_;
  std::string buffer_;
};

}  // namespace dspark
