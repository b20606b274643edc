#include "hub/http.h"

#include <gtest/gtest.h>

namespace dspark {
namespace {

TEST(UrlTest, ParsesSchemeHostPortAndTarget) {
  const Url hub = parse_url("https://huggingface.co");
  EXPECT_EQ(hub.origin(), "https://huggingface.co:443");
  EXPECT_EQ(hub.target, "/");
  const Url local = parse_url("http://127.0.0.1:8123/api/models/a/b?x=1#frag");
  EXPECT_EQ(local.host, "127.0.0.1");
  EXPECT_EQ(local.port, 8123);
  EXPECT_EQ(local.target, "/api/models/a/b?x=1");
  EXPECT_EQ(parse_url("http://[::1]:9/x").host, "[::1]");
  EXPECT_THROW(parse_url("ftp://host/x"), HubError);
  EXPECT_THROW(parse_url("huggingface.co/x"), HubError);
  EXPECT_THROW(parse_url("http://host:99999/"), HubError);
}

TEST(UrlTest, RedirectLocationsResolveLikeABrowser) {
  const std::string base = "http://127.0.0.1:8000/org/name/resolve/abc/config.json?x=1";
  EXPECT_EQ(resolve_location(base, "https://cdn.example/blob?sig=a%2Fb"),
            "https://cdn.example/blob?sig=a%2Fb");
  EXPECT_EQ(resolve_location(base, "/api/new/name"), "http://127.0.0.1:8000/api/new/name");
  EXPECT_EQ(resolve_location(base, "other.json"),
            "http://127.0.0.1:8000/org/name/resolve/abc/other.json");
  EXPECT_EQ(resolve_location(base, "//cdn.example/x"), "http://cdn.example/x");
}

TEST(UrlTest, PercentEncodingKeepsUnreservedCharacters) {
  EXPECT_EQ(percent_encode("refs/pr/1", false), "refs%2Fpr%2F1");
  EXPECT_EQ(percent_encode("dir/my file+1.json", true), "dir/my%20file%2B1.json");
  EXPECT_EQ(percent_encode("A-z_0.9~", false), "A-z_0.9~");
}

TEST(UrlTest, NextPageComesFromTheLinkHeader) {
  EXPECT_EQ(next_page_link("<https://hub/api/x?cursor=abc>; rel=\"next\""),
            "https://hub/api/x?cursor=abc");
  EXPECT_EQ(next_page_link("<https://hub/a>; rel=\"prev\", <https://hub/b>; rel=\"next\""),
            "https://hub/b");
  EXPECT_FALSE(next_page_link(""));
  EXPECT_FALSE(next_page_link("<https://hub/a>; rel=\"prev\""));
}

HubSettings settings_with_token(const std::string& token) {
  HubSettings settings;
  settings.endpoint = "https://hub.example";
  settings.cache_dir = "/cache";
  settings.token = token;
  return settings;
}

HubError error_for(int status, const std::string& code, const std::string& message,
                   const std::string& token = "") {
  return hub_error_for({status, code, message, "https://hub.example/api/models/o/n"}, "o/n",
                       settings_with_token(token));
}

bool mentions(const HubError& error, const std::string& text) {
  return std::string(error.what()).find(text) != std::string::npos;
}

TEST(HubErrorTest, StatusesBecomeErrorsThatSayWhatToDo) {
  const HubError missing = error_for(401, "RepoNotFound", "");
  EXPECT_EQ(missing.kind(), HubErrorKind::kNotFound);
  EXPECT_TRUE(mentions(missing, "o/n: repository not found on https://hub.example"));
  EXPECT_TRUE(mentions(missing, "set HF_TOKEN"));
  EXPECT_TRUE(mentions(error_for(404, "RepoNotFound", "", "hf_x"), "HF_TOKEN has no access"));
  EXPECT_EQ(error_for(404, "", "").kind(), HubErrorKind::kNotFound);

  const HubError bad_token = error_for(401, "", "Invalid credentials in Authorization header", "x");
  EXPECT_EQ(bad_token.kind(), HubErrorKind::kUnauthorized);
  EXPECT_TRUE(mentions(bad_token, "rejected HF_TOKEN"));

  const HubError gated = error_for(403, "GatedRepo", "");
  EXPECT_EQ(gated.kind(), HubErrorKind::kGated);
  EXPECT_TRUE(mentions(gated, "gated"));
  EXPECT_TRUE(mentions(gated, "HF_TOKEN"));

  const HubError forbidden = error_for(403, "", "no");
  EXPECT_EQ(forbidden.kind(), HubErrorKind::kUnauthorized);
  EXPECT_TRUE(mentions(forbidden, "HF_TOKEN"));
  const HubError unauthorised = error_for(401, "", "");
  EXPECT_EQ(unauthorised.kind(), HubErrorKind::kUnauthorized);
  EXPECT_TRUE(mentions(unauthorised, "HF_TOKEN"));

  EXPECT_EQ(error_for(404, "RevisionNotFound", "").kind(), HubErrorKind::kNotFound);
  EXPECT_TRUE(mentions(error_for(404, "RevisionNotFound", ""), "revision not found"));
  EXPECT_EQ(error_for(503, "", "").kind(), HubErrorKind::kNetwork);
  EXPECT_EQ(error_for(418, "", "").kind(), HubErrorKind::kInvalid);
}

}  // namespace
}  // namespace dspark
