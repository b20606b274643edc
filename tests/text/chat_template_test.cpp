// Chat template loading and rendering with the real fixture templates. Expected prompts follow
// docs/model-math.md §10.1 and are what Python jinja2 renders (the oracle test compares thousands
// of renderings live).
#include "text/chat_template.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dspark {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(DSPARK_PUBLIC_FIXTURES);

std::string read(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

ChatTemplateInputs conversation(const char* messages_json) {
  ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(messages_json);
  inputs.add_generation_prompt = true;
  return inputs;
}

class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              ("dspark_chat_template_" + std::to_string(::getpid()) + "_" +
               std::to_string(counter_++))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

TEST(ChatTemplate, NemotronGenerationPromptFollowsThinkingFlag) {
  const ChatTemplate nemotron(read(kFixtures / "nemotron-3-nano/chat_template.jinja"), "nemotron");
  ChatTemplateInputs inputs = conversation(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(nemotron.render(inputs),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
            "assistant\n<think>\n");
  inputs.kwargs["enable_thinking"] = false;
  EXPECT_EQ(nemotron.render(inputs),
            "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
            "assistant\n<think></think>");
}

TEST(ChatTemplate, NemotronToolsToolCallsAndGroupedResults) {
  const ChatTemplate nemotron(
      read(kFixtures / "templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.lf.jinja"), "nemotron");
  ChatTemplateInputs inputs = conversation(R"([
      {"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "warm"}])");
  inputs.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}}])");
  const std::string prompt = nemotron.render(inputs);
  EXPECT_TRUE(
      prompt.starts_with("<|im_start|>system\nSys\n\n# Tools\n\nYou have access to the following "
                         "functions:\n\n<tools>\n<function>\n"
                         "<name>get_weather</name>\n<parameters>\n<parameter>\n<name>city</"
                         "name>\n<type>string</type>\n</parameter>\n"
                         "<required>[\"city\"]</required>\n</parameters>\n</function>\n</"
                         "tools>\n\nIf you choose to call a function"))
      << prompt;
  EXPECT_TRUE(prompt.ends_with(
      "</IMPORTANT><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think></"
      "think>\n<tool_call>\n"
      "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</"
      "tool_call>\n<|im_end|>\n"
      "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</"
      "tool_response>\n"
      "<|im_end|>\n<|im_start|>assistant\n<think>\n"))
      << prompt;
}

TEST(ChatTemplate, CrlfTemplateRendersLikeLf) {
  const ChatTemplate crlf(read(kFixtures / "nemotron-3-nano/chat_template.jinja"));
  const ChatTemplate lf(read(kFixtures / "templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.lf.jinja"));
  ChatTemplateInputs inputs =
      conversation(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A", "reasoning_content": "R"},
      {"role": "user", "content": "Q2"}])");
  EXPECT_EQ(crlf.render(inputs), lf.render(inputs));
}

TEST(ChatTemplate, QwenThinkingOffAndLlamaSpecialTokens) {
  const ChatTemplate qwen(read(kFixtures / "qwen3/chat_template.jinja"));
  ChatTemplateInputs inputs = conversation(R"([{"role": "user", "content": "Hi"}])");
  inputs.kwargs["enable_thinking"] = false;
  EXPECT_EQ(qwen.render(inputs),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  const ChatTemplate llama(read(kFixtures / "templates/meta-llama-Llama-3.1-8B-Instruct.jinja"));
  inputs.kwargs = nlohmann::ordered_json::object();
  inputs.bos_token = "<|begin_of_text|>";
  EXPECT_EQ(llama.render(inputs),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\n"
            "Today Date: 26 Jul "
            "2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, TemplateRefusalsSurfaceTheirMessage) {
  const ChatTemplate gemma(read(kFixtures / "templates/google-gemma-2-2b-it.jinja"));
  try {
    gemma.render(
        conversation(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])"));
    FAIL() << "gemma 2 accepts no system message";
  } catch (const jinja::TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "System role not supported");
  }
}

TEST(ChatTemplate, RejectsKwargsThatShadowRendererVariables) {
  const ChatTemplate qwen(read(kFixtures / "qwen3/chat_template.jinja"));
  ChatTemplateInputs inputs = conversation(R"([{"role": "user", "content": "Hi"}])");
  inputs.kwargs["messages"] = nlohmann::ordered_json::array();
  EXPECT_THROW(qwen.render(inputs), Error);
}

TEST(ChatTemplateSet, LoadsFromTokenizerConfigStringOrNamedList) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "{{ messages[0].content }}!"})");
  ChatTemplateSet set = ChatTemplateSet::load(dir.path());
  EXPECT_EQ(set.select(false), "{{ messages[0].content }}!");

  dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "D"},
      {"name": "tool_use", "template": "T"}]})");
  set = ChatTemplateSet::load(dir.path());
  EXPECT_EQ(set.select(false), "D");
  EXPECT_EQ(set.select(true), "T");
  EXPECT_EQ(set.select(false, "tool_use"), "T");
  EXPECT_THROW(set.select(false, "rag"), Error);

  // chat_template.jinja overrides tokenizer_config.json, as in transformers.
  dir.write("chat_template.jinja", "J");
  EXPECT_EQ(ChatTemplateSet::load(dir.path()).select(true), "J");
}

TEST(ChatTemplateSet, LoadsTheRealQwenTokenizerConfig) {
  const ChatTemplateSet set = ChatTemplateSet::load(kFixtures / "qwen3");
  // The fixture directory has chat_template.jinja, which equals the config's template.
  const ChatTemplateSet from_config = ChatTemplateSet::from_config(
      nlohmann::ordered_json::parse(read(kFixtures / "qwen3/tokenizer_config.json")),
      "tokenizer_config.json");
  EXPECT_EQ(set.select(false), from_config.select(false));
}

TEST(ChatTemplateSet, ReportsMissingTemplates) {
  TempDir dir;
  EXPECT_THROW(ChatTemplateSet::load(dir.path()), Error);
  dir.write("tokenizer_config.json", R"({"bos_token": null})");
  EXPECT_THROW(ChatTemplateSet::load(dir.path()), Error);
  dir.write("tokenizer_config.json", R"({"chat_template": 5})");
  EXPECT_THROW(ChatTemplateSet::load(dir.path()), Error);
}

}  // namespace
}  // namespace dspark
