#pragma once
// A Jinja2 template engine for chat templates: parses once, renders many times, and produces the
// same text as Python jinja2 configured the way Hugging Face transformers renders chat templates
// (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension;
// transformers' tojson, raise_exception and strftime_now). Constructs it does not implement fail
// with an error naming the construct and its line.
//
// Errors: dspark::Error ("<name> line N: ..."), or TemplateRaisedError (jinja_builtins.h) carrying
// exactly the message the template passed to raise_exception().
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja_builtins.h"
#include "text/jinja_value.h"

namespace dspark::jinja {

struct Stmt;

// What one render may spend. A model's chat template is untrusted input: a self-calling macro,
// nested loops or string doubling must end in an error naming the limit, not in a crash, a hang
// or the process running out of memory. The defaults are far above what chat templates need.
struct RenderLimits {
  // Macro and caller() calls in progress at once.
  int max_call_depth = 64;
  // Statements and expressions being evaluated inside one another (bounds the machine stack,
  // with room to spare under AddressSanitizer).
  int max_nesting = 512;
  // Loop iterations in the whole render, all loops together.
  int64_t max_loop_iterations = 1'000'000;
  // Bytes of any one string: the output, a captured block, a value.
  size_t max_string_bytes = size_t{32} << 20;
};

class Template {
 public:
  // `name` prefixes error messages (e.g. the file the source came from).
  explicit Template(std::string_view source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables` (a dict of the names the template reads, e.g. messages, tools,
  // add_generation_prompt).
  std::string render(const Dict& variables, const RenderLimits& limits = {}) const;

 private:
  std::string name_;
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace dspark::jinja
