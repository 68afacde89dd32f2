#pragma once
// GGUF v3 reader (memory-mapped, bounds-checked) and writer.
// Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/tensor_types.h"

namespace tandem::gguf {

enum class value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

struct value;
using array = std::vector<value>;
// One metadata value: `type` says which member holds it (unsigned widths in u, signed in i,
// f32/f64 in f, ...) and is kept so a writer reproduces the file's exact types.
// (Plain members rather than std::variant: g++ 12 warns falsely on variants of strings.)
struct value {
  value_type type = value_type::u32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::shared_ptr<array> arr;
  value_type elem_type = value_type::u32;  // element type when type == array

  bool is_unsigned() const;
  bool is_signed() const;
  bool is_float() const { return type == value_type::f32 || type == value_type::f64; }
  static value of_u(value_type t, uint64_t x) {
    value v;
    v.type = t;
    v.u = x;
    return v;
  }
  static value of_i(value_type t, int64_t x) {
    value v;
    v.type = t;
    v.i = x;
    return v;
  }
  static value of_f(value_type t, double x) {
    value v;
    v.type = t;
    v.f = x;
    return v;
  }
  static value of_bool(bool x) {
    value v;
    v.type = value_type::boolean;
    v.b = x;
    return v;
  }
  static value of_string(std::string x) {
    value v;
    v.type = value_type::string;
    v.s = std::move(x);
    return v;
  }
  static value of_array(value_type elem, std::shared_ptr<array> a) {
    value v;
    v.type = value_type::array;
    v.elem_type = elem;
    v.arr = std::move(a);
    return v;
  }
};

struct tensor_info {
  std::string name;
  std::vector<int64_t> shape;  // ggml order: shape[0] is the contiguous (innermost) dimension
  kernels::dtype type = kernels::dtype::f32;
  uint64_t offset = 0;  // relative to the start of the data section
  uint64_t size_bytes = 0;
  const void* data = nullptr;  // points into the mapping (reader only)
  int64_t n_elements() const;
};

class file {
 public:
  // Maps and validates `path`. Throws tandem::failure with errc::io_error, malformed_file or
  // unsupported and a message naming the problem (and the offending key or tensor).
  // skip_unsupported_types: tensors of types tandem lacks are left out of tensors() and listed
  // in unsupported_tensors() instead of refused (for `model inspect`).
  static file open(const std::string& path, bool skip_unsupported_types = false);
  // Parses an in-memory image (same validation); the buffer must outlive the file.
  static file parse(const void* data, size_t size, std::string name = "<memory>");

  file(file&&) noexcept;
  file& operator=(file&&) noexcept;
  ~file();

  uint32_t version() const { return version_; }
  const std::map<std::string, value>& metadata() const { return kv_; }
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  const tensor_info* find_tensor(std::string_view name) const;
  const value* find(std::string_view key) const;
  uint64_t file_size() const { return size_; }
  // "'name' (TYPE, type N)" for each tensor of a type tandem lacks (open with skip_unsupported_types).
  const std::vector<std::string>& unsupported_tensors() const { return unsupported_; }
  const std::string& path() const { return path_; }

  // Typed getters: throw failure(missing_key) when absent (unless a default is given) and
  // failure(malformed_file) when present with the wrong type.
  uint64_t get_uint(std::string_view key) const;
  uint64_t get_uint(std::string_view key, uint64_t def) const;
  double get_float(std::string_view key) const;
  double get_float(std::string_view key, double def) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string def) const;
  bool get_bool(std::string_view key, bool def) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  std::vector<int32_t> get_int_array(std::string_view key) const;

 private:
  file() = default;
  // skip_unsupported_types: as open's.
  void parse_image(const uint8_t* base, size_t size, bool skip_unsupported_types = false);

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, value> kv_;
  std::vector<tensor_info> tensors_;
  std::vector<std::string> unsupported_;
};

// Builds a GGUF v3 file: metadata first, then tensors (data copied, aligned to `alignment`).
class writer {
 public:
  void set(const std::string& key, value v);
  void set_u32(const std::string& key, uint32_t x);
  void set_i32(const std::string& key, int32_t x);
  void set_f32(const std::string& key, float x);
  void set_bool(const std::string& key, bool x);
  void set_string(const std::string& key, std::string s);
  void set_strings(const std::string& key, const std::vector<std::string>& xs);
  void set_f32s(const std::string& key, const std::vector<float>& xs);
  void set_i32s(const std::string& key, const std::vector<int32_t>& xs);
  // shape in ggml order (innermost first); bytes must hold exactly the tensor's data.
  void add_tensor(const std::string& name, std::vector<int64_t> shape, kernels::dtype type, std::vector<uint8_t> bytes);
  // Writes atomically (temp file + rename). Throws failure(io_error).
  void write(const std::string& path, uint32_t alignment = 32) const;

 private:
  std::vector<std::pair<std::string, value>> kv_;
  struct pending_tensor {
    std::string name;
    std::vector<int64_t> shape;
    kernels::dtype type;
    std::vector<uint8_t> bytes;
  };
  std::vector<pending_tensor> tensors_;
};

}  // namespace tandem::gguf
