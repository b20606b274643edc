// Reasoning and tool-call parsing: the edge cases of docs/server-api.md §3.4, each checked
// one-shot and streamed in every two-piece split, byte by byte and in random chunks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "text/tool_call_parser.h"
#include "text/utf8.h"

namespace dspark {
namespace {

using Json = nlohmann::ordered_json;
const std::filesystem::path kFixtures = std::filesystem::path(DSPARK_PUBLIC_FIXTURES);

std::string read(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
     "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
     "coords": {"type": "array"}, "options": {"type": "object"},
     "limit": {"type": ["number", "null"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
     "properties": {"q": {"type": "string"}}}}}
])");

std::string nemotron_template() {
  return read(kFixtures / "templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.lf.jinja");
}
std::string qwen_template() {
  return read(kFixtures / "qwen3/chat_template.jinja");
}

ChatOutputParser::Config nemotron(bool thinking = true, const Json& tools = kTools) {
  return ChatOutputParser::configure(
      nemotron_template(),
      thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think></think>",
      tools);
}

ParsedOutput stream(const ChatOutputParser::Config& config, std::string_view text,
                    const std::vector<size_t>& sizes) {
  ChatOutputParser parser(config);
  std::vector<OutputEvent> events;
  size_t pos = 0;
  for (size_t i = 0; pos < text.size(); ++i) {
    const size_t take =
        i < sizes.size() ? std::min(sizes[i], text.size() - pos) : text.size() - pos;
    for (auto& event : parser.feed(text.substr(pos, take))) events.push_back(std::move(event));
    pos += take;
  }
  for (auto& event : parser.finish()) events.push_back(std::move(event));
  for (const auto& event : events)
    EXPECT_TRUE(utf8_is_valid(event.text)) << "event splits a character";
  return collect_events(events);
}

void expect_same(const ParsedOutput& a, const ParsedOutput& b, const std::string& how) {
  EXPECT_EQ(a.reasoning, b.reasoning) << how;
  EXPECT_EQ(a.content, b.content) << how;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << how;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << how;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << how;
  }
}

// The one-shot parse, after checking that every chunking streams to the same result.
ParsedOutput parse(const ChatOutputParser::Config& config, std::string_view text) {
  const ParsedOutput whole = parse_output(config, text);
  for (size_t split = 0; split <= text.size(); ++split) {
    expect_same(stream(config, text, {split}), whole, "split at " + std::to_string(split));
  }
  expect_same(stream(config, text, std::vector<size_t>(text.size(), 1)), whole, "byte by byte");
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i < text.size(); ++i) sizes.push_back(1 + rng() % 6);
    expect_same(stream(config, text, sizes), whole, "random chunks");
  }
  return whole;
}

TEST(ReasoningParser, OutputStartsInsideForcedOpenReasoning) {
  const ParsedOutput out = parse(nemotron(), "Let me think.\nStep two.\n</think>\nIt is sunny.");
  EXPECT_EQ(out.reasoning, "Let me think.\nStep two.");
  EXPECT_EQ(out.content, "It is sunny.");
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ReasoningParser, RepeatedOpeningTagIsDropped) {
  const ParsedOutput out = parse(nemotron(), "<think>\nR\n</think>\nC");
  EXPECT_EQ(out.reasoning, "R");
  EXPECT_EQ(out.content, "C");
}

TEST(ReasoningParser, ThinkingOffAndOpeningTagInOutput) {
  EXPECT_EQ(parse(nemotron(false), "Plain answer.").content, "Plain answer.");
  EXPECT_EQ(parse(nemotron(false), "Plain answer.").reasoning, "");
  // Qwen 3 with thinking on leaves the tag to the model.
  const auto qwen = ChatOutputParser::configure(qwen_template(), "<|im_start|>assistant\n", Json());
  EXPECT_FALSE(qwen.starts_in_reasoning);
  const ParsedOutput out = parse(qwen, "<think>\nWeighing options.\n</think>\n\nAnswer.");
  EXPECT_EQ(out.reasoning, "Weighing options.");
  EXPECT_EQ(out.content, "Answer.");
  EXPECT_EQ(parse(qwen, "  No think tag <think> here").content, "No think tag <think> here");
}

TEST(ReasoningParser, TruncationInsideReasoningLeavesContentEmpty) {
  const ParsedOutput out = parse(nemotron(), "Still thinking about </thi");
  EXPECT_EQ(out.reasoning, "Still thinking about </thi");
  EXPECT_EQ(out.content, "");
}

TEST(ReasoningParser, MentioningToolCallDoesNotEndReasoning) {
  const ParsedOutput out =
      parse(nemotron(), "I could emit <tool_call> syntax, but no.\n</think>\nDone.");
  EXPECT_EQ(out.reasoning, "I could emit <tool_call> syntax, but no.");
  EXPECT_EQ(out.content, "Done.");
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ReasoningParser, ToolCallInsideUnclosedReasoningEndsIt) {
  const ParsedOutput out =
      parse(nemotron(),
            "I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call>\n");
  EXPECT_EQ(out.reasoning, "I need the weather.");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city":"Paris"})");
}

TEST(ReasoningParser, PromptDecidesTheInitialState) {
  const ReasoningSyntax syntax;
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", syntax));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think></think>", syntax));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n", syntax));
  EXPECT_TRUE(prompt_opens_reasoning("<think>a</think> ... <think>", syntax));
}

TEST(ToolCallParser, XmlCallsWithTypedParametersAndSurroundingContent) {
  const ParsedOutput out = parse(
      nemotron(false),
      "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
      "<parameter=coords>\n[1.5, -2]\n</parameter>\n<parameter=options>\n{\"a\": {\"b\": null}}\n"
      "</parameter>\n<parameter=limit>\nnull\n</parameter>\n<parameter=note>\nline one\nline two\n"
      "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=q>\n42\n"
      "</parameter>\n</function>\n</tool_call>\nAll done.");
  EXPECT_EQ(out.content, "Checking.\nAll done.");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(out.tool_calls[0].arguments),
            Json::parse(R"({"city": "São Paulo", "days": 3, "metric": true, "coords": [1.5, -2],
                           "options": {"a": {"b": null}}, "limit": null,
                           "note": "line one\nline two"})"));
  EXPECT_EQ(out.tool_calls[1].arguments, R"({"q":"42"})");
}

// Content loses its leading whitespace only: a reply that ends in content keeps its last
// whitespace (the text before a stop string, a reply cut at max_tokens), a tool call drops the
// whitespace around it.
TEST(ToolCallParser, ContentKeepsItsLastWhitespaceUnlessACallFollows) {
  EXPECT_EQ(parse(nemotron(false), "1. 1\n").content, "1. 1\n");
  EXPECT_EQ(parse(nemotron(false), "  Hello, \n").content, "Hello, \n");
  EXPECT_EQ(parse(nemotron(false, Json()), "9. 9\n").content, "9. 9\n");
  const ParsedOutput called = parse(
      nemotron(false), "Text \n<tool_call>\n<function=search>\n</function>\n</tool_call>\n\n");
  EXPECT_EQ(called.content, "Text");
  EXPECT_EQ(called.tool_calls.size(), 1u);
}

// A raw completion's text is the model's, whatever markup or whitespace it holds.
TEST(ChatOutputParser, VerbatimKeepsEveryCharacter) {
  ChatOutputParser::Config config = nemotron(true);
  config.verbatim = true;
  const std::string text =
      " the <think>x</think>\n<tool_call>\n<function=search>\n</function>\n"
      "</tool_call> caf\xc3\xa9 \n";
  const ParsedOutput out = parse(config, text);
  EXPECT_EQ(out.content, text);
  EXPECT_EQ(out.reasoning, "");
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ToolCallParser, CutOffOrMalformedCallsFallBackToContent) {
  const std::string truncated = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  EXPECT_EQ(parse(nemotron(false), truncated).content, truncated);
  EXPECT_TRUE(parse(nemotron(false), truncated).tool_calls.empty());
  const std::string malformed =
      "<tool_call>\n<function=get_weather>\n<city>Paris</city>\n</function>\n</tool_call>";
  EXPECT_EQ(parse(nemotron(false), "Text " + malformed).content, "Text " + malformed);
  // A complete function block still counts when only the closing </tool_call> is missing.
  const ParsedOutput unclosed =
      parse(nemotron(false), "<tool_call>\n<function=search>\n</function>\n");
  ASSERT_EQ(unclosed.tool_calls.size(), 1u);
  EXPECT_EQ(unclosed.tool_calls[0].arguments, "{}");
}

TEST(ToolCallParser, WithoutToolsMarkupStaysContent) {
  const std::string text = "<tool_call>\n<function=search>\n</function>\n</tool_call>";
  const ParsedOutput out = parse(nemotron(false, Json()), text);
  EXPECT_EQ(out.content, text);
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ToolCallParser, HermesJsonCalls) {
  const auto qwen = ChatOutputParser::configure(qwen_template(), "<|im_start|>assistant\n", kTools);
  EXPECT_EQ(qwen.format, ToolCallFormat::kHermesJson);
  const ParsedOutput out = parse(
      qwen,
      "<think>\nNeed data.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", "
      "\"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>");
  EXPECT_EQ(out.reasoning, "Need data.");
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(out.tool_calls[1].arguments, R"({"q":"x"})");
  const std::string broken =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": }\n</tool_call>";
  EXPECT_EQ(parse(qwen, broken).content, broken);
}

TEST(ToolCallParser, NemotronNanoV2JsonList) {
  const auto v2 =
      ChatOutputParser::configure(read(kFixtures / "templates/NVIDIA-Nemotron-Nano-v2.jinja"),
                                  "<SPECIAL_11>Assistant\n<think></think>", kTools);
  EXPECT_EQ(v2.format, ToolCallFormat::kNemotronJsonList);
  const ParsedOutput out =
      parse(v2,
            "<TOOLCALL>[{\"name\": \"search\", \"arguments\": {\"q\": \"a\"}}, "
            "{\"name\": \"get_weather\", \"arguments\": {}}]</TOOLCALL>");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "search");
  EXPECT_EQ(out.tool_calls[1].name, "get_weather");
}

TEST(ToolCallParser, LlamaWholeReplyJson) {
  const auto llama = ChatOutputParser::configure(
      read(kFixtures / "templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
      "<|start_header_id|>assistant<|end_header_id|>\n\n", kTools);
  EXPECT_EQ(llama.format, ToolCallFormat::kLlamaJson);
  EXPECT_FALSE(llama.reasoning.has_value());
  const ParsedOutput out =
      parse(llama,
            "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"a;b\"}}; "
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"q":"a;b"})");
  EXPECT_EQ(out.content, "");
  const std::string truncated = "{\"name\": \"search\", \"parameters\": {\"q\":";
  EXPECT_EQ(parse(llama, truncated).content, truncated);
  EXPECT_EQ(parse(llama, "Sure: {\"name\": \"search\"}").content, "Sure: {\"name\": \"search\"}");
}

// What a detokenizer that leaves special tokens out must still spell for each parser.
TEST(ChatOutputParser, MarkersAreTheMarkupItReads) {
  using Markers = std::vector<std::string>;
  EXPECT_EQ(parser_markers(nemotron(true)),
            (Markers{"<think>", "</think>", "<tool_call>", "</tool_call>"}));
  EXPECT_EQ(parser_markers(nemotron(true, Json())), (Markers{"<think>", "</think>"}));
  ChatOutputParser::Config verbatim = nemotron(true);
  verbatim.verbatim = true;
  EXPECT_EQ(parser_markers(verbatim), Markers{});
  const auto llama = ChatOutputParser::configure(
      read(kFixtures / "templates/meta-llama-Llama-3.1-8B-Instruct.jinja"), "", kTools);
  EXPECT_EQ(parser_markers(llama), Markers{"<|python_tag|>"});
  const auto v2 =
      ChatOutputParser::configure(read(kFixtures / "templates/NVIDIA-Nemotron-Nano-v2.jinja"),
                                  "<SPECIAL_11>Assistant\n<think></think>", kTools);
  EXPECT_EQ(parser_markers(v2), (Markers{"<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>"}));
}

TEST(ToolCallParser, PartialMarkersAreHeldBackWhileStreaming) {
  ChatOutputParser parser(nemotron(false));
  std::string shown;
  for (const auto& event : parser.feed("Hello <tool")) shown += event.text;
  EXPECT_EQ(shown, "Hello");
  for (const auto& event : parser.feed("_call>\n<function=search>\n</function>\n</tool_call>")) {
    EXPECT_NE(event.kind, OutputEvent::Kind::kContent) << event.text;
  }
  ChatOutputParser reasoning(nemotron());
  for (const auto& event : reasoning.feed("Thinking</thi"))
    EXPECT_EQ(event.text.find('<'), std::string::npos);
}

TEST(ToolCallParser, UnicodeIsNeverSplitAcrossEvents) {
  const ParsedOutput out = parse(nemotron(), "思考 🙂 é\n</think>\n好的 — 👩‍💻");
  EXPECT_EQ(out.reasoning, "思考 🙂 é");
  EXPECT_EQ(out.content, "好的 — 👩‍💻");
}

TEST(ToolCallParser, InvalidUtf8InArgumentsBecomesReplacementCharacters) {
  const ParsedOutput out = parse(nemotron(false),
                                 "<tool_call>\n<function=search>\n<parameter=q>\nab\xff\n</"
                                 "parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"q\":\"ab\xEF\xBF\xBD\"}");
}

TEST(ToolCallParser, CoercesParametersBySchemaType) {
  auto coerce = [](const char* text, const char* schema) {
    return coerce_parameter(text, Json::parse(schema));
  };
  EXPECT_EQ(coerce("3", R"({"type": "integer"})"), Json(3));
  EXPECT_EQ(coerce(" 7 ", R"({"type": "integer"})"), Json(7));
  EXPECT_EQ(coerce("3.5", R"({"type": "integer"})"), Json("3.5"));
  EXPECT_EQ(coerce("3.5", R"({"type": "number"})"), Json(3.5));
  EXPECT_EQ(coerce("False", R"({"type": "boolean"})"), Json(false));
  EXPECT_EQ(coerce("yes", R"({"type": "boolean"})"), Json("yes"));
  EXPECT_EQ(coerce("[1, 2]", R"({"type": "array"})"), Json::parse("[1, 2]"));
  EXPECT_EQ(coerce("[1, 2]", R"({"type": "object"})"), Json("[1, 2]"));
  EXPECT_EQ(coerce("null", R"({"type": ["integer", "null"]})"), Json());
  EXPECT_EQ(coerce("12", R"({"anyOf": [{"type": "integer"}, {"type": "string"}]})"), Json(12));
  EXPECT_EQ(coerce("12", R"({"type": "string"})"), Json("12"));
  EXPECT_EQ(coerce("12", "null"), Json("12"));
  EXPECT_EQ(coerce("12", R"({"type": "whatever"})"), Json("12"));
}

TEST(ToolCallParser, FormatsDetectedFromFixtureTemplates) {
  EXPECT_EQ(detect_tool_call_format(read(kFixtures / "nemotron-3-nano/chat_template.jinja")),
            ToolCallFormat::kXmlFunction);
  EXPECT_EQ(detect_tool_call_format(qwen_template()), ToolCallFormat::kHermesJson);
  EXPECT_EQ(detect_tool_call_format(read(kFixtures / "templates/NVIDIA-Nemotron-Nano-v2.jinja")),
            ToolCallFormat::kNemotronJsonList);
  EXPECT_EQ(
      detect_tool_call_format(read(kFixtures / "templates/meta-llama-Llama-3.2-3B-Instruct.jinja")),
      ToolCallFormat::kLlamaJson);
  EXPECT_EQ(detect_tool_call_format(read(kFixtures / "templates/google-gemma-3-4b-it.jinja")),
            ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format(read(kFixtures / "templates/HuggingFaceTB-SmolLM3-3B.jinja")),
            ToolCallFormat::kNone);
}

}  // namespace
}  // namespace dspark
