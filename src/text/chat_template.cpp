#include "text/chat_template.h"

#include "base/error.h"
#include "base/file_io.h"

namespace dspark {
namespace {

nlohmann::ordered_json read_json(const std::filesystem::path& path) {
  try {
    return nlohmann::ordered_json::parse(read_file(path.string()));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
}

// `value` with every string and key passed through `mark`. Values nested past the template
// engine's own limit are refused here already (this copy recurses).
nlohmann::ordered_json marked(const nlohmann::ordered_json& value,
                              const std::function<std::string(std::string_view)>& mark,
                              int depth = 0) {
  if (depth > jinja::kMaxValueNesting) {
    fail("jinja: value nesting limit: lists, dicts and namespaces nested deeper than {}",
         jinja::kMaxValueNesting);
  }
  if (value.is_string()) return mark(value.get_ref<const std::string&>());
  if (value.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& item : value) out.push_back(marked(item, mark, depth + 1));
    return out;
  }
  if (value.is_object()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [key, item] : value.items()) out[mark(key)] = marked(item, mark, depth + 1);
    return out;
  }
  return value;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string name)
    : source_(source), template_(source, std::move(name)) {}

std::string ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  if (!inputs.messages.is_array()) fail("chat template: messages must be an array");
  if (!inputs.tools.is_null() && !inputs.tools.is_array())
    fail("chat template: tools must be an array or null");
  if (!inputs.kwargs.is_object()) fail("chat template: template kwargs must be an object");
  // transformers: render(messages=, tools=, documents=, add_generation_prompt=,
  // **{**special_tokens_map, **kwargs}).
  auto content = [&](const nlohmann::ordered_json& value) {
    return jinja::Value::from_json(inputs.mark_content ? marked(value, inputs.mark_content)
                                                       : value);
  };
  jinja::Dict variables;
  variables.set("messages", content(inputs.messages));
  variables.set("tools", content(inputs.tools));
  variables.set("documents", jinja::Value::none());
  variables.set("add_generation_prompt", jinja::Value::boolean(inputs.add_generation_prompt));
  if (inputs.bos_token) variables.set("bos_token", jinja::Value::string(*inputs.bos_token));
  if (inputs.eos_token) variables.set("eos_token", jinja::Value::string(*inputs.eos_token));
  for (const auto& [key, value] : inputs.kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "documents" ||
        key == "add_generation_prompt") {
      fail("chat template: kwarg '{}' clashes with a variable the renderer sets", key);
    }
    variables.set(key, content(value));
  }
  return template_.render(variables);
}

ChatTemplateSet ChatTemplateSet::from_config(const nlohmann::ordered_json& config,
                                             const std::string& origin) {
  ChatTemplateSet set;
  set.origin_ = origin;
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) fail("{}: no chat_template", origin);
  if (it->is_string()) {
    set.templates_["default"] = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        fail("{}: chat_template list entries need string \"name\" and \"template\"", origin);
      }
      set.templates_[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
    }
  } else {
    fail("{}: chat_template must be a string or a list of named templates", origin);
  }
  if (set.templates_.empty()) fail("{}: chat_template list is empty", origin);
  return set;
}

ChatTemplateSet ChatTemplateSet::load(const std::filesystem::path& model_dir) {
  const auto jinja_path = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    ChatTemplateSet set;
    set.origin_ = jinja_path.string();
    set.templates_["default"] = read_file(jinja_path.string());
    return set;
  }
  const auto json_path = model_dir / "chat_template.json";
  if (std::filesystem::exists(json_path))
    return from_config(read_json(json_path), json_path.string());
  const auto config_path = model_dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path))
    return from_config(read_json(config_path), config_path.string());
  fail(
      "{}: no chat template (looked for chat_template.jinja, chat_template.json, "
      "tokenizer_config.json)",
      model_dir.string());
}

const std::string& ChatTemplateSet::select(bool has_tools, const std::string& requested) const {
  if (!requested.empty()) {
    const auto it = templates_.find(requested);
    if (it == templates_.end()) fail("{}: no chat template named '{}'", origin_, requested);
    return it->second;
  }
  if (has_tools) {
    const auto it = templates_.find("tool_use");
    if (it != templates_.end()) return it->second;
  }
  const auto it = templates_.find("default");
  if (it != templates_.end()) return it->second;
  fail("{}: several chat templates and none named 'default'; choose one by name", origin_);
}

}  // namespace dspark
