#pragma once
// Chat templates: loading them from a model directory and rendering a conversation into the
// prompt text, with the same variables Hugging Face transformers' apply_chat_template passes.
//
// Key order matters (tool schemas render in their given order), so messages, tools and kwargs
// are nlohmann::ordered_json.
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "text/jinja_template.h"

namespace dspark {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // The tool schemas ([{"type": "function", "function": {...}}, ...]), or null for no tools: the
  // template then sees `tools` defined as None, as with transformers.
  nlohmann::ordered_json tools;
  bool add_generation_prompt = false;
  // Extra template variables (chat_template_kwargs): enable_thinking, reasoning_effort, ...
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  // Special tokens from the tokenizer config; an absent token is undefined in the template.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // When set, every string (and object key) of messages, tools and kwargs passes through it
  // before the template sees it: Tokenizer::mark_special_tokens, so that the rendered prompt,
  // tokenized with Tokenizer::encode_marked, gets control tokens only from the template's own
  // markup. Unset: content may contain control tokens (--special-tokens-in-content).
  std::function<std::string(std::string_view)> mark_content;
};

class ChatTemplate {
 public:
  // `name` appears in error messages (e.g. "tokenizer_config.json chat_template").
  explicit ChatTemplate(std::string_view source, std::string name = "chat template");

  // Throws dspark::Error for template errors, or jinja::TemplateRaisedError (a dspark::Error
  // subclass) with the template's own message when it calls raise_exception(), e.g. for a role
  // order it does not accept.
  std::string render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
};

// The templates a model ships, by name ("default" when there is a single one).
class ChatTemplateSet {
 public:
  // Looks in `model_dir` for chat_template.jinja, then chat_template.json, then the
  // "chat_template" of tokenizer_config.json (a string, or a list of {"name", "template"}),
  // the order in which transformers lets them override each other.
  static ChatTemplateSet load(const std::filesystem::path& model_dir);
  // From a parsed tokenizer_config.json (or chat_template.json) object.
  static ChatTemplateSet from_config(const nlohmann::ordered_json& config,
                                     const std::string& origin);

  // transformers' choice: the requested name if given; else "tool_use" when tools are passed and
  // such a template exists; else "default".
  const std::string& select(bool has_tools, const std::string& requested = "") const;
  const std::map<std::string, std::string>& templates() const { return templates_; }
  const std::string& origin() const { return origin_; }

 private:
  std::map<std::string, std::string> templates_;
  std::string origin_;
};

}  // namespace dspark
