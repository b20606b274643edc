#include "base/file_io.h"

#include <fstream>
#include <sstream>

#include "base/error.h"

namespace dspark {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return text.str();
}

}  // namespace dspark
