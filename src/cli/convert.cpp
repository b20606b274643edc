// `dspark convert`: GGUF files to MLX-format directories (lossless for Q4_0 / Q4_1 / Q8_0), and
// Hugging Face checkpoints to MLX affine-quantized ones (as mlx_lm.convert --quantize does).
#include <fmt/format.h>

#include <filesystem>

#include "base/error.h"
#include "cli/commands.h"
#include "convert/gguf_to_mlx.h"
#include "convert/hf_to_mlx.h"
#include "formats/model_store.h"

namespace dspark::cli {

void add_convert_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "convert", "Convert a GGUF file or a Hugging Face checkpoint into an MLX-format model");
  struct Options {
    std::string gguf;
    std::string hf;
    HfConversionOptions hf_options;
    std::string output;
    std::string models_dir;
  };
  auto options = std::make_shared<Options>();
  auto* gguf = command->add_option("--gguf", options->gguf, "GGUF file to convert")
                   ->check(CLI::ExistingFile);
  auto* hf = command
                 ->add_option("--hf", options->hf,
                              "Hugging Face checkpoint directory (bf16/f16/f32 safetensors) to "
                              "convert and quantize")
                 ->check(CLI::ExistingDirectory)
                 ->excludes(gguf);
  gguf->excludes(hf);
  command
      ->add_option("--q-bits", options->hf_options.bits,
                   "Bits per weight for --hf: 2, 3, 4, 5, 6 or 8")
      ->capture_default_str()
      ->needs(hf);
  command
      ->add_option("--q-group-size", options->hf_options.group_size,
                   "Quantization group size for --hf: 32, 64 or 128")
      ->capture_default_str()
      ->needs(hf);
  command
      ->add_option("--dtype", options->hf_options.dtype,
                   "dtype of the scales and unquantized tensors for --hf (float16, bfloat16, "
                   "float32; default: the config's torch_dtype)")
      ->needs(hf);
  command->add_option("--output,-o", options->output,
                      "Output directory (default: the models directory / the input's name)");
  command->add_option("--models-dir", options->models_dir, "Models directory");
  command->callback([options] {
    if (options->gguf.empty() == options->hf.empty()) {
      fail("convert: give either --gguf FILE or --hf DIR");
    }
    std::string output = options->output;
    if (!options->hf.empty()) {
      if (output.empty()) {
        // "dir/" has an empty filename(); its parent path's name is the checkpoint's.
        std::filesystem::path input(options->hf);
        const auto name =
            input.filename().empty() ? input.parent_path().filename() : input.filename();
        output = (std::filesystem::path(models_dir(options->models_dir)) /
                  fmt::format("{}-{}bit", name.string(), options->hf_options.bits))
                     .string();
      }
      const auto summary = convert_hf_to_mlx(options->hf, output, options->hf_options);
      fmt::print(
          "converted {} ({}): {} tensors in {} file(s), {} modules quantized to {} bits "
          "(group {}), {} left unquantized, {:.1f} MB -> {}\n",
          options->hf, summary.architecture, summary.tensors, summary.shards,
          summary.quantized_modules, options->hf_options.bits, options->hf_options.group_size,
          summary.unquantized_modules, summary.output_bytes / 1e6, output);
      return;
    }
    if (output.empty()) {
      output = (std::filesystem::path(models_dir(options->models_dir)) /
                std::filesystem::path(options->gguf).stem())
                   .string();
    }
    const auto summary = convert_gguf_to_mlx(options->gguf, output);
    fmt::print("converted {} ({}): {} tensors, {} quantized, {:.1f} MB -> {}\n", options->gguf,
               summary.architecture, summary.tensors, summary.quantized_tensors,
               summary.output_bytes / 1e6, output);
  });
}

void add_models_command(CLI::App& app) {
  auto* command = app.add_subcommand("models", "List the installed models");
  auto dir = std::make_shared<std::string>();
  command->add_option("--models-dir", *dir, "Models directory");
  command->callback([dir] {
    const std::string where = models_dir(*dir);
    const auto models = list_models(where);
    if (models.empty()) {
      fmt::print("no models in {}\n", where);
      return;
    }
    fmt::print("{:<40} {:<12} {:<14} {:>10}\n", "model", "architecture", "quantization", "size");
    for (const auto& model : models) {
      fmt::print("{:<40} {:<12} {:<14} {:>8.1f}MB{}\n", model.name, model.architecture,
                 model.quantization, model.bytes / 1e6,
                 model.name == kDefaultModelName ? "  (default)" : "");
    }
    fmt::print("({})\n", where);
  });
}

}  // namespace dspark::cli
