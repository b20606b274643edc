#include "hub/repo_ref.h"

#include <algorithm>
#include <cctype>

#include "hub/hub_error.h"

namespace dspark {
namespace {

// The hub's repo name rules: letters, digits, '-', '_', '.', at most 96 characters, no "--" or
// ".." (the cache folder name joins parts with "--"), not starting or ending with '-' or '.'.
void check_name_part(const std::string& part, const std::string& text) {
  if (part.empty() || part.size() > 96) {
    fail_hub(HubErrorKind::kInvalid, "'{}': repo id parts must be 1 to 96 characters", text);
  }
  for (char c : part) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      fail_hub(HubErrorKind::kInvalid,
               "'{}': repo ids may only use letters, digits, '-', '_' and '.' (found '{}')", text,
               c);
    }
  }
  if (part.find("--") != std::string::npos || part.find("..") != std::string::npos) {
    fail_hub(HubErrorKind::kInvalid, "'{}': repo ids cannot contain '--' or '..'", text);
  }
  if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.') {
    fail_hub(HubErrorKind::kInvalid, "'{}': repo id parts cannot start or end with '-' or '.'",
             text);
  }
}

}  // namespace

std::string RepoRef::org() const {
  return repo_id.substr(0, repo_id.find('/'));
}

std::string RepoRef::name() const {
  return repo_id.substr(repo_id.find('/') + 1);
}

std::string RepoRef::display() const {
  return revision == "main" ? repo_id : repo_id + "@" + revision;
}

bool is_commit_hash(const std::string& revision) {
  return revision.size() == 40 && std::all_of(revision.begin(), revision.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

std::optional<RepoRef> parse_repo_ref(const std::string& text) {
  const size_t at = text.find('@');
  const std::string id = text.substr(0, at);
  if (std::count(id.begin(), id.end(), '/') != 1) return std::nullopt;
  const size_t slash = id.find('/');
  const std::string org = id.substr(0, slash);
  const std::string name = id.substr(slash + 1);
  // "./x", "../x", "~/x" and the like are paths, never repo ids.
  if (org.empty() || name.empty() || org == "." || org == ".." || org == "~") return std::nullopt;
  check_name_part(org, text);
  check_name_part(name, text);
  RepoRef ref;
  ref.repo_id = id;
  if (at != std::string::npos) {
    ref.revision = text.substr(at + 1);
    if (ref.revision.empty()) {
      fail_hub(HubErrorKind::kInvalid, "'{}': empty revision after '@'", text);
    }
    // Revisions become paths under refs/ in the cache: refuse anything that could escape it.
    if (ref.revision.front() == '/' || ref.revision.back() == '/' ||
        ref.revision.find("..") != std::string::npos ||
        ref.revision.find("//") != std::string::npos ||
        std::any_of(ref.revision.begin(), ref.revision.end(), [](char c) {
          return std::iscntrl(static_cast<unsigned char>(c)) || c == '\\' || c == ' ';
        })) {
      fail_hub(HubErrorKind::kInvalid, "'{}': invalid revision '{}'", text, ref.revision);
    }
  }
  return ref;
}

}  // namespace dspark
