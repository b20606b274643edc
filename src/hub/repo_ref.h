#pragma once
// A Hugging Face model repo reference as given to --model: "org/name" or "org/name@revision",
// where the revision is a branch, a tag or a commit hash (default "main").
#include <optional>
#include <string>

namespace dspark {

struct RepoRef {
  std::string repo_id;  // "org/name"
  std::string revision = "main";

  std::string org() const;
  std::string name() const;
  // "org/name" or "org/name@revision" when the revision is not main.
  std::string display() const;
};

// nullopt when `text` is not shaped like a repo id (no single '/' separating two names): such
// text is a path or a local model name. Throws HubError(kInvalid) when it is shaped like one but
// breaks the hub's naming rules (characters, "--", "..", length), naming the rule.
std::optional<RepoRef> parse_repo_ref(const std::string& text);

// True for a full 40-hex-digit commit hash, which the cache and the hub address directly.
bool is_commit_hash(const std::string& revision);

}  // namespace dspark
