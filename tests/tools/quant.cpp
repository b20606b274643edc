// Drives the quantization kernels for tests/oracle/test_quant_mlx.py through .npy files in one
// directory. BF16 and F16 arrays travel as their raw 16-bit patterns ('<u2').
//
//   dspark_tool_quant <command> dir=DIR bits=B group=G scale_dtype=BF16|F16|F32 [isa=NAME]
//   quantize:        weights.npy (f4 [rows, cols])           -> packed.npy, scales.npy, biases.npy
//   dequantize:      packed.npy, scales.npy, biases.npy      -> dequantized.npy (f4), and
//                    dequantized_mlx.npy (f4, rounded as MLX does in the scale dtype)
//   qmatmul:         x.npy (f4 [m, cols]), packed/scales/biases ([rows, ..] or [experts, rows,
//   ..]),
//                    expert=E                                -> y.npy (f4 [m, rows])
//   gather_qmatmul:  x.npy, ids.npy (i4 [m]), packed/scales/biases [experts, rows, ..] -> y.npy
#include "kernels/quant.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"

namespace {

using dspark::DType;
using dspark::fail;
namespace kernels = dspark::kernels;

struct NpyArray {
  std::string descr;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("{}: not an .npy file", path);
  uint32_t header_size = 0;
  if (magic[6] == 1) {
    uint16_t size16 = 0;
    in.read(reinterpret_cast<char*>(&size16), 2);
    header_size = size16;
  } else {
    in.read(reinterpret_cast<char*>(&header_size), 4);
  }
  std::string header(header_size, '\0');
  in.read(header.data(), header_size);
  NpyArray array;
  const auto descr_at = header.find("'descr': '");
  if (descr_at == std::string::npos) fail("{}: header without descr", path);
  array.descr = header.substr(descr_at + 10, header.find('\'', descr_at + 10) - descr_at - 10);
  if (header.find("'fortran_order': True") != std::string::npos) fail("{}: Fortran order", path);
  const auto open = header.find('(', header.find("'shape'"));
  const auto close = header.find(')', open);
  std::stringstream dims(header.substr(open + 1, close - open - 1));
  for (std::string dim; std::getline(dims, dim, ',');) {
    if (dim.find_first_not_of(' ') != std::string::npos) array.shape.push_back(std::stoll(dim));
  }
  const int64_t item = array.descr == "<f4" || array.descr == "<u4" || array.descr == "<i4" ? 4 : 2;
  array.data.resize(array.count() * item);
  in.read(reinterpret_cast<char*>(array.data.data()),
          static_cast<std::streamsize>(array.data.size()));
  if (!in) fail("{}: truncated", path);
  return array;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data, size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto size = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&size), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) fail("{}: write failed", path);
}

struct Options {
  std::map<std::string, std::string> values;
  std::string get(const std::string& key) const {
    auto found = values.find(key);
    if (found == values.end()) fail("missing option {}=", key);
    return found->second;
  }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto found = values.find(key);
    return found == values.end() ? fallback : found->second;
  }
};

DType scale_dtype_named(const std::string& name) {
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  if (name == "F32") return DType::F32;
  fail("scale_dtype={} is not BF16, F16 or F32", name);
}

kernels::Isa isa_named(const std::string& name) {
  for (auto isa : {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avxvnni,
                   kernels::Isa::avx512, kernels::Isa::avx512vnni}) {
    if (name == kernels::isa_name(isa)) return isa;
  }
  if (name == "best") return kernels::best_isa();
  fail("isa={} is not scalar, avx2, avxvnni, avx512, avx512vnni or best", name);
}

// The packed / scales / biases arrays of DIR as one QuantMatrix over `storage`.
kernels::QuantMatrix load_matrix(const std::string& dir, const Options& options,
                                 std::vector<NpyArray>& storage) {
  storage.push_back(read_npy(dir + "/packed.npy"));
  storage.push_back(read_npy(dir + "/scales.npy"));
  storage.push_back(read_npy(dir + "/biases.npy"));
  const NpyArray& packed = storage[0];
  kernels::QuantMatrix w;
  w.format = {std::stoi(options.get("bits")), std::stoi(options.get("group"))};
  w.scale_dtype = scale_dtype_named(options.get("scale_dtype"));
  w.packed = packed.data.data();
  w.scales = storage[1].data.data();
  w.biases = storage[2].data.data();
  const size_t rank = packed.shape.size();
  w.experts = rank == 3 ? packed.shape[0] : 1;
  w.rows = packed.shape[rank - 2];
  w.cols = packed.shape[rank - 1] * 32 / w.format.bits;
  return w;
}

void run(const std::string& command, const Options& options) {
  const std::string dir = options.get("dir");
  if (command == "quantize") {
    const NpyArray weights = read_npy(dir + "/weights.npy");
    const int64_t rows = weights.shape[0], cols = weights.shape[1];
    const kernels::QuantFormat format{std::stoi(options.get("bits")),
                                      std::stoi(options.get("group"))};
    const DType dtype = scale_dtype_named(options.get("scale_dtype"));
    const int64_t words = cols * format.bits / 32, groups = cols / format.group_size;
    const size_t scale_bytes = dtype == DType::F32 ? 4 : 2;
    std::vector<uint32_t> packed(rows * words);
    std::vector<uint8_t> scales(rows * groups * scale_bytes), biases(scales.size());
    kernels::quantize(reinterpret_cast<const float*>(weights.data.data()), rows, cols, format,
                      dtype, packed.data(), scales.data(), biases.data());
    const std::string descr = dtype == DType::F32 ? "<f4" : "<u2";
    write_npy(dir + "/packed.npy", "<u4", {rows, words}, packed.data(), packed.size() * 4);
    write_npy(dir + "/scales.npy", descr, {rows, groups}, scales.data(), scales.size());
    write_npy(dir + "/biases.npy", descr, {rows, groups}, biases.data(), biases.size());
  } else if (command == "dequantize") {
    std::vector<NpyArray> storage;
    const kernels::QuantMatrix w = load_matrix(dir, options, storage);
    std::vector<float> out(w.experts * w.rows * w.cols), out_mlx(out.size());
    for (int64_t e = 0; e < w.experts; ++e) {
      kernels::dequantize_rows(w, e, 0, w.rows, out.data() + e * w.rows * w.cols);
      kernels::dequantize_rows_mlx(w, e, 0, w.rows, out_mlx.data() + e * w.rows * w.cols);
    }
    write_npy(dir + "/dequantized.npy", "<f4", {w.experts * w.rows, w.cols}, out.data(),
              out.size() * 4);
    write_npy(dir + "/dequantized_mlx.npy", "<f4", {w.experts * w.rows, w.cols}, out_mlx.data(),
              out_mlx.size() * 4);
  } else if (command == "qmatmul" || command == "gather_qmatmul") {
    std::vector<NpyArray> storage;
    const kernels::QuantMatrix w = load_matrix(dir, options, storage);
    const NpyArray x = read_npy(dir + "/x.npy");
    const int64_t m = x.shape[0];
    if (x.shape[1] != w.cols) fail("x.npy has {} columns, the matrix {}", x.shape[1], w.cols);
    const kernels::Isa isa = isa_named(options.get("isa", "best"));
    std::vector<float> y(m * w.rows);
    const auto* xs = reinterpret_cast<const float*>(x.data.data());
    if (command == "qmatmul") {
      kernels::qmatmul_isa(isa, xs, m, w, y.data(), std::stoll(options.get("expert", "0")));
    } else {
      const NpyArray ids = read_npy(dir + "/ids.npy");
      kernels::gather_qmatmul_isa(isa, xs, m, reinterpret_cast<const int32_t*>(ids.data.data()), w,
                                  y.data());
    }
    write_npy(dir + "/y.npy", "<f4", {m, w.rows}, y.data(), y.size() * 4);
  } else {
    fail("unknown command {}", command);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s quantize|dequantize|qmatmul|gather_qmatmul key=value...\n",
                 argv[0]);
    return 2;
  }
  Options options;
  for (int k = 2; k < argc; ++k) {
    const std::string arg = argv[k];
    const auto equals = arg.find('=');
    if (equals == std::string::npos) {
      std::fprintf(stderr, "argument %s is not key=value\n", argv[k]);
      return 2;
    }
    options.values[arg.substr(0, equals)] = arg.substr(equals + 1);
  }
  try {
    run(argv[1], options);
  } catch (const dspark::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
