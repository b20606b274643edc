#pragma once
// Errors are exceptions carrying a message that names the file, tensor, field or parameter at
// fault. Handlers at the edges (CLI, server requests) catch dspark::Error and report it.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dspark {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dspark
