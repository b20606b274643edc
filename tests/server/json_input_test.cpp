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
