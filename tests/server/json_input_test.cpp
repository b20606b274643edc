#include "server/json_input.h"

#include <gtest/gtest.h>

#include <string>

#include "server/dialect.h"
#include "server/server.h"

namespace dspark::server {
namespace {

using Json = nlohmann::json;

// The ApiError `body` throws (status 0 and "" when it throws none).
std::pair<int, std::string> refusal(const std::function<void()>& body) {
  try {
    body();
  } catch (const ApiError& e) {
    return {e.status(), e.what()};
  }
  return {0, ""};
}

std::string nested(int depth, const std::string& open, const std::string& close) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  text += "1";
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

TEST(Utf8, AcceptsWellFormedAndFindsTheFirstBadByte) {
  EXPECT_EQ(invalid_utf8_offset("plain ascii"), std::string_view::npos);
  EXPECT_EQ(invalid_utf8_offset("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            std::string_view::npos);
  EXPECT_EQ(invalid_utf8_offset("ab\xff"), 2u);
  EXPECT_EQ(invalid_utf8_offset("\xc0\xaf"), 0u);          // overlong '/'
  EXPECT_EQ(invalid_utf8_offset("x\xed\xa0\x80"), 1u);     // UTF-16 surrogate
  EXPECT_EQ(invalid_utf8_offset("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(invalid_utf8_offset("ok\xe2\x82"), 2u);        // cut short
}

TEST(JsonInput, DepthLimitIsExactAndIgnoresBracketsInStrings) {
  EXPECT_NO_THROW(parse_json_input(nested(kMaxJsonDepth, "[", "]"), "the body"));
  const auto [status, message] =
      refusal([] { parse_json_input(nested(kMaxJsonDepth + 1, "[", "]"), "the body"); });
  EXPECT_EQ(status, 400);
  EXPECT_NE(message.find(std::to_string(kMaxJsonDepth)), std::string::npos) << message;
  // 20,000 levels inside a field: refused by the flat scan, nothing recursive runs.
  const std::string deep =
      R"({"chat_template_kwargs": {"x": )" + nested(20000, "{\"a\":", "}") + "}}";
  EXPECT_EQ(refusal([&] { parse_json_input(deep, "the body"); }).first, 400);
  EXPECT_TRUE(nests_too_deep(nested(20000, "[", "]")));
  // Brackets and escaped quotes inside strings are text.
  const std::string brackets = "{\"s\": \"" + std::string(1000, '[') + "\\\"[[[\"}";
  EXPECT_FALSE(nests_too_deep(brackets));
  EXPECT_EQ(parse_json_input(brackets, "the body")["s"].get<std::string>().size(), 1004u);
}

TEST(JsonInput, InvalidUtf8AndNonFiniteNumbersNameTheProblem) {
  const auto [status, message] =
      refusal([] { parse_json_input("{\"content\": \"a\xff\"}", "the request body"); });
  EXPECT_EQ(status, 400);
  EXPECT_NE(message.find("UTF-8"), std::string::npos) << message;
  const auto nan = refusal([] { parse_json_input(R"({"temperature": NaN})", "the body"); });
  EXPECT_EQ(nan.first, 400);
  EXPECT_NE(nan.second.find("'temperature'"), std::string::npos) << nan.second;
  EXPECT_EQ(refusal([] { parse_json_input(R"({"top_p": -Infinity})", "the body"); }).first, 400);
  // Inside strings the words are text.
  EXPECT_NO_THROW(parse_json_input(R"({"content": "NaN Infinity"})", "the body"));
  EXPECT_EQ(refusal([] { parse_json_input("{\"a\": ", "the body"); }).first, 400);
}

TEST(JsonInput, NumbersPastADoubleNameTheFieldTheyAreIn) {
  // nlohmann refuses these itself ("number overflow parsing '1e999'"), naming no field.
  const auto top = refusal([] { parse_json_input(R"({"max_tokens": 1e999})", "the body"); });
  EXPECT_EQ(top.first, 400);
  EXPECT_EQ(top.second, "'max_tokens' holds the number 1e999, which is too large for a double");
  const auto nested = refusal([] {
    parse_json_input(R"({"messages": [{"role": "user"}], "response_format": {"json_schema":)"
                     R"( {"schema": {"type": "number", "maximum": -2E+400}}}})",
                     "the body");
  });
  EXPECT_EQ(nested.second,
            "'response_format.json_schema.schema.maximum' holds the number -2E+400, which is too "
            "large for a double");
  // 400 digits and no exponent overflow too; the message shows only the start of the literal.
  const auto digits = refusal(
      [] { parse_json_input(R"({"seed": [1, )" + std::string(400, '9') + "]}", "the body"); });
  EXPECT_EQ(digits.second, "'seed' holds the number " + std::string(32, '9') +
                               "..., which is too large for a double");
  EXPECT_EQ(refusal([] { parse_json_input("[1e999]", "the body"); }).second,
            "the body holds the number 1e999, which is too large for a double");
  // In range, underflowing to zero, or inside strings: accepted.
  EXPECT_NO_THROW(
      parse_json_input(R"({"a": 1.7e308, "b": 1e-999, "c": "1e999", "d": -0.5})", "the body"));
  // The key path follows the nesting back out: after an object closes, its parent's key names
  // what comes next.
  EXPECT_EQ(refusal([] { parse_json_input(R"({"a": {"b": 1}, "c": [2, 1e999]})", "x"); }).second,
            "'c' holds the number 1e999, which is too large for a double");
}

TEST(FieldSizes, NestedFieldsPastTheirCapAreRefusedByName) {
  const Json question = Json::array({{{"role", "user"}, {"content", "hi"}}});
  auto big_string = [](size_t bytes) { return std::string(bytes, 'x'); };
  auto refused_field = [](const std::function<void()>& parse) {
    try {
      parse();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("bytes; at most"), std::string::npos) << e.what();
      return e.param();
    }
    return std::string("(accepted)");
  };
  Json chat = {{"messages", question},
               {"chat_template_kwargs", {{"x", big_string(kMaxTemplateKwargsBytes)}}}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(chat); }), "chat_template_kwargs");
  EXPECT_EQ(refused_field([&] { anthropic::parse_messages(chat); }), "chat_template_kwargs");
  chat["chat_template_kwargs"] = {{"x", big_string(kMaxTemplateKwargsBytes - 100)}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(chat); }), "(accepted)");

  const Json schema = {{"type", "object"}, {"description", big_string(kMaxToolBytes)}};
  const Json openai_tools = {
      {"messages", question},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", schema}}}}}}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(openai_tools); }), "tools[0]");
  const Json anthropic_tools = {{"messages", question},
                                {"tools",
                                 {{{"name", "g"}, {"input_schema", {{"type", "object"}}}},
                                  {{"name", "f"}, {"input_schema", schema}}}}};
  EXPECT_EQ(refused_field([&] { anthropic::parse_messages(anthropic_tools); }), "tools[1]");
  Json many_tools = {{"input", "hi"}, {"tools", Json::array()}};
  for (int i = 0; i < 5; ++i) {
    many_tools["tools"].push_back(
        {{"type", "function"}, {"name", "f"}, {"description", big_string(kMaxToolsBytes / 5)}});
  }
  EXPECT_EQ(refused_field([&] { responses::parse(many_tools); }), "tools");

  const Json call_arguments = {
      {"messages",
       {{{"role", "user"}, {"content", "hi"}},
        {{"role", "assistant"},
         {"tool_calls",
          {{{"type", "function"},
            {"function",
             {{"name", "f"},
              {"arguments", "\"" + big_string(kMaxToolArgumentsBytes) + "\""}}}}}}}}}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(call_arguments); }),
            "tool_calls.function.arguments");
  const Json tool_use = {{"messages",
                          {{{"role", "user"}, {"content", "hi"}},
                           {{"role", "assistant"},
                            {"content",
                             {{{"type", "tool_use"},
                               {"name", "f"},
                               {"input", {{"text", big_string(kMaxToolArgumentsBytes)}}}}}}}}}};
  EXPECT_EQ(refused_field([&] { anthropic::parse_messages(tool_use); }), "tool_use.input");
  const Json function_call = {{"input",
                               {{{"type", "function_call"},
                                 {"name", "f"},
                                 {"arguments", big_string(kMaxToolArgumentsBytes + 1)}},
                                {{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(refused_field([&] { responses::parse(function_call); }), "function_call.arguments");

  const Json metadata = {{"messages", question},
                         {"input", "hi"},
                         {"metadata", {{"user_id", big_string(kMaxMetadataBytes)}}}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(metadata); }), "metadata");
  EXPECT_EQ(refused_field([&] { anthropic::parse_messages(metadata); }), "metadata");
  EXPECT_EQ(refused_field([&] { responses::parse(metadata); }), "metadata");

  const Json format = {
      {"messages", question},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema",
         {{"name", "s"},
          {"schema",
           {{"type", "string"}, {"description", big_string(kMaxResponseSchemaBytes)}}}}}}}};
  EXPECT_EQ(refused_field([&] { openai::parse_chat(format); }),
            "response_format.json_schema.schema");
}

TEST(JsonInput, DumpReplacesInvalidUtf8InsteadOfThrowing) {
  const Json value = {{"piece", std::string("\xe2\x82")}};
  EXPECT_THROW((void)value.dump(), nlohmann::json::type_error);
  EXPECT_EQ(dump_json(value), "{\"piece\":\"\xef\xbf\xbd\"}");
}

TEST(Sampling, NonFiniteOutOfRangeAndMistypedFieldsAreRefusedByName) {
  auto refused_field = [](const std::string& body) {
    try {
      openai::parse_chat(Json::parse(body));
    } catch (const ApiError& e) {
      return e.status() == 400 ? e.param() : std::string("status ") + std::to_string(e.status());
    }
    return std::string("accepted");
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(refused_field("{" + messages + R"(, "temperature": 1e300})"), "temperature");
  EXPECT_EQ(refused_field("{" + messages + R"(, "temperature": -1})"), "temperature");
  EXPECT_EQ(refused_field("{" + messages + R"(, "top_p": 1e300})"), "top_p");
  EXPECT_EQ(refused_field("{" + messages + R"(, "top_k": 1e30})"), "top_k");
  EXPECT_EQ(refused_field("{" + messages + R"(, "top_k": 4294967296})"), "top_k");
  EXPECT_EQ(refused_field("{" + messages + R"(, "min_p": 2})"), "min_p");
  EXPECT_EQ(refused_field("{" + messages + R"(, "presence_penalty": 1e40})"), "presence_penalty");
  EXPECT_EQ(refused_field("{" + messages + R"(, "max_tokens": 1e30})"), "max_tokens");
  EXPECT_EQ(refused_field("{" + messages + R"(, "max_tokens": 18446744073709551615})"),
            "max_tokens");
  EXPECT_EQ(refused_field("{" + messages + R"(, "seed": "7"})"), "seed");
  EXPECT_EQ(refused_field("{" + messages + R"(, "seed": 1.5})"), "seed");
  EXPECT_EQ(refused_field("{" + messages + R"(, "seed": true})"), "seed");
  EXPECT_EQ(refused_field("{" + messages + R"(, "seed": 18446744073709551615, "top_k": -1})"),
            "accepted");
  auto anthropic_refused = [&](const std::string& field) {
    try {
      anthropic::parse_messages(
          Json::parse("{" + messages + ", \"max_tokens\": 8, " + field + "}"));
    } catch (const ApiError& e) {
      return e.param();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(anthropic_refused(R"("top_p": 0)"), "top_p");
  EXPECT_EQ(anthropic_refused(R"("temperature": 3.5e38)"), "temperature");
}

TEST(ToolArguments, DeepArgumentStringsAreRefused) {
  const std::string arguments = nested(20000, "[", "]");
  Json body = {
      {"messages",
       {{{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}}}}}}}};
  EXPECT_EQ(refusal([&] { openai::parse_chat(body); }).first, 400);
}

TEST(Cors, LoopbackOriginsAlwaysOthersOnlyWhenListed) {
  for (const char* origin : {"http://localhost", "http://localhost:3000", "http://127.0.0.1:8080",
                             "http://[::1]:5173", "https://localhost:443"}) {
    EXPECT_TRUE(origin_allowed(origin, {})) << origin;
  }
  for (const char* origin : {"https://evil.example", "http://localhost.evil.example",
                             "http://127.0.0.1.evil.example", "http://localhost:80x", "null"}) {
    EXPECT_FALSE(origin_allowed(origin, {})) << origin;
  }
  EXPECT_TRUE(origin_allowed("https://app.example", {"https://app.example"}));
  EXPECT_TRUE(origin_allowed("https://a.b.example", {"https://*.example"}));
  EXPECT_FALSE(origin_allowed("https://example.org", {"https://*.example"}));
  EXPECT_TRUE(origin_allowed("anything://at-all", {"*"}));
}

}  // namespace
}  // namespace dspark::server
