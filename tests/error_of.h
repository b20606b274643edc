#pragma once
// The message of the dspark::Error a call throws, or "(no error)": tests match on what the user
// would read.
#include <functional>
#include <string>

#include "base/error.h"

namespace dspark::testing {

inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace dspark::testing
