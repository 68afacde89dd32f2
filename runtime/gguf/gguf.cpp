#include "runtime/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "runtime/atomic_file.h"
#include "runtime/errors.h"

namespace tandem::gguf {
namespace {

constexpr uint32_t gguf_magic = 0x46554747;  // "GGUF" little-endian
constexpr int max_array_depth = 4;
constexpr uint32_t max_dims = 4;

[[noreturn]] void malformed(const std::string& what) { throw failure(errc::malformed_file, what); }

const char* ggml_type_name(uint32_t t) {
  static const char* names[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
                                "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
  return t < std::size(names) ? names[t] : "unknown";
}

// Bounds-checked reader over the file image: every read names what it was reading when it fails.
class cursor {
 public:
  cursor(const uint8_t* base, size_t size) : base_(base), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  void need(uint64_t n, const char* what) {
    if (n > remaining())
      malformed(std::string("file is truncated while reading ") + what + " at offset " + std::to_string(pos_) +
                " (needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left)");
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

size_t scalar_size(value_type t) {
  switch (t) {
    case value_type::u8:
    case value_type::i8:
    case value_type::boolean: return 1;
    case value_type::u16:
    case value_type::i16: return 2;
    case value_type::u32:
    case value_type::i32:
    case value_type::f32: return 4;
    case value_type::u64:
    case value_type::i64:
    case value_type::f64: return 8;
    case value_type::string: return 8;  // at least the length prefix
    case value_type::array: return 12;  // at least type + count
  }
  return 1;
}

value read_value(cursor& c, value_type t, const std::string& key, int depth) {
  value v;
  v.type = t;
  switch (t) {
    case value_type::u8: v.u = c.read<uint8_t>(key.c_str()); break;
    case value_type::u16: v.u = c.read<uint16_t>(key.c_str()); break;
    case value_type::u32: v.u = c.read<uint32_t>(key.c_str()); break;
    case value_type::u64: v.u = c.read<uint64_t>(key.c_str()); break;
    case value_type::i8: v.i = c.read<int8_t>(key.c_str()); break;
    case value_type::i16: v.i = c.read<int16_t>(key.c_str()); break;
    case value_type::i32: v.i = c.read<int32_t>(key.c_str()); break;
    case value_type::i64: v.i = c.read<int64_t>(key.c_str()); break;
    case value_type::f32: v.f = c.read<float>(key.c_str()); break;
    case value_type::f64: v.f = c.read<double>(key.c_str()); break;
    case value_type::boolean: {
      const uint8_t b = c.read<uint8_t>(key.c_str());
      if (b > 1) malformed("metadata key '" + key + "': boolean value " + std::to_string(b));
      v.b = b == 1;
      break;
    }
    case value_type::string: v.s = c.read_string(key.c_str()); break;
    case value_type::array: {
      if (depth >= max_array_depth) malformed("metadata key '" + key + "': arrays nested too deep");
      const uint32_t et = c.read<uint32_t>(key.c_str());
      if (et > uint32_t(value_type::f64))
        malformed("metadata key '" + key + "': unknown array element type " + std::to_string(et));
      const uint64_t n = c.read<uint64_t>(key.c_str());
      // Each element takes at least scalar_size bytes: a count beyond that is a lie, so
      // refuse it before allocating anything.
      if (n > c.remaining() / scalar_size(value_type(et)))
        malformed("metadata key '" + key + "': array of " + std::to_string(n) + " elements does not fit in the file");
      v.elem_type = value_type(et);
      auto arr = std::make_shared<array>();
      arr->reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) arr->push_back(read_value(c, value_type(et), key, depth + 1));
      v.arr = std::move(arr);
      break;
    }
    default: malformed("metadata key '" + key + "': unknown value type " + std::to_string(uint32_t(t)));
  }
  return v;
}

const char* type_label(value_type t) {
  switch (t) {
    case value_type::u8: return "u8";
    case value_type::i8: return "i8";
    case value_type::u16: return "u16";
    case value_type::i16: return "i16";
    case value_type::u32: return "u32";
    case value_type::i32: return "i32";
    case value_type::f32: return "f32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "u64";
    case value_type::i64: return "i64";
    case value_type::f64: return "f64";
  }
  return "?";
}

[[noreturn]] void wrong_type(std::string_view key, const value& v, const char* want) {
  malformed("metadata key '" + std::string(key) + "' has type " + type_label(v.type) + ", expected " + want);
}

}  // namespace

bool value::is_unsigned() const {
  return type == value_type::u8 || type == value_type::u16 || type == value_type::u32 || type == value_type::u64;
}
bool value::is_signed() const {
  return type == value_type::i8 || type == value_type::i16 || type == value_type::i32 || type == value_type::i64;
}

int64_t tensor_info::n_elements() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

file file::open(const std::string& path, bool skip_unsupported_types) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw failure(errc::io_error, "cannot open model file '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw failure(errc::io_error, "model file '" + path + "' is not a regular file");
  }
  file f;
  f.path_ = path;
  f.size_ = size_t(st.st_size);
  if (f.size_ > 0) {
    void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw failure(errc::io_error, "cannot map model file '" + path + "': " + std::strerror(e));
    }
    f.map_ = m;
  }
  ::close(fd);
  try {
    f.parse_image(static_cast<const uint8_t*>(f.map_), f.size_, skip_unsupported_types);
  } catch (const failure& e) {
    throw failure(e.code(), "'" + path + "': " + e.what());
  }
  return f;
}

file file::parse(const void* data, size_t size, std::string name) {
  file f;
  f.path_ = std::move(name);
  f.size_ = size;
  f.parse_image(static_cast<const uint8_t*>(data), size);
  return f;
}

file::file(file&& o) noexcept { *this = std::move(o); }

file& file::operator=(file&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    unsupported_ = std::move(o.unsupported_);
  }
  return *this;
}

file::~file() {
  if (map_) ::munmap(map_, size_);
}

void file::parse_image(const uint8_t* base, size_t size, bool skip_unsupported_types) {
  cursor c(base, size);
  if (size < 4) malformed("file is too small to be GGUF (" + std::to_string(size) + " bytes)");
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != gguf_magic) malformed("not a GGUF file (bad magic)");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    throw failure(errc::unsupported, "GGUF version " + std::to_string(version_) + " is not supported (2 and 3 are)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Smallest possible entries: a kv is 8 (key len) + 4 (type) + 1; a tensor info 8 + 4 + 4 + 8.
  if (n_kv > c.remaining() / 13) malformed("metadata count " + std::to_string(n_kv) + " does not fit in the file");
  if (n_tensors > c.remaining() / 24)
    malformed("tensor count " + std::to_string(n_tensors) + " does not fit in the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    const uint32_t t = c.read<uint32_t>("metadata value type");
    if (t > uint32_t(value_type::f64)) malformed("metadata key '" + key + "': unknown value type " + std::to_string(t));
    value v = read_value(c, value_type(t), key, 0);
    if (!kv_.emplace(key, std::move(v)).second) malformed("metadata key '" + key + "' appears twice");
  }

  uint64_t alignment = get_uint("general.alignment", 32);
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    malformed("general.alignment " + std::to_string(alignment) + " is not a power of two");

  tensors_.reserve(size_t(n_tensors));
  std::vector<std::string> unsupported;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    tensor_info ti;
    ti.name = c.read_string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > max_dims)
      malformed("tensor '" + ti.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dimension");
      if (dim == 0 || dim > (uint64_t(1) << 40) || n_el > (uint64_t(1) << 48) / dim)
        malformed("tensor '" + ti.name + "' has an invalid dimension " + std::to_string(dim));
      n_el *= dim;
      ti.shape.push_back(int64_t(dim));
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    const auto dt = kernels::dtype_from_ggml(type);
    if (!dt) {  // read on, to name every such tensor at once
      unsupported.push_back("'" + ti.name + "' (" + ggml_type_name(type) + ", type " + std::to_string(type) + ")");
      (void)c.read<uint64_t>("tensor offset");
      continue;
    }
    ti.type = *dt;
    if (ti.shape[0] % kernels::block_elems(ti.type) != 0)
      malformed("tensor '" + ti.name + "': row length " + std::to_string(ti.shape[0]) + " is not a multiple of the " +
                std::string(kernels::to_string(ti.type)) + " block size");
    ti.size_bytes = uint64_t(n_el / uint64_t(kernels::block_elems(ti.type)) * uint64_t(kernels::block_bytes(ti.type)));
    ti.offset = c.read<uint64_t>("tensor offset");
    if (ti.offset % alignment != 0)
      malformed("tensor '" + ti.name + "' offset " + std::to_string(ti.offset) + " is not aligned to " +
                std::to_string(alignment));
    tensors_.push_back(std::move(ti));
  }

  unsupported_ = unsupported;
  if (!unsupported.empty() && !skip_unsupported_types) {
    std::string list;
    for (size_t i = 0; i < unsupported.size() && i < 6; ++i) list += (i ? ", " : "") + unsupported[i];
    if (unsupported.size() > 6) list += " and " + std::to_string(unsupported.size() - 6) + " more";
    throw failure(errc::unsupported,
                  std::to_string(unsupported.size()) + " tensor" +
                      (unsupported.size() > 1 ? "s have types" : " has a type") + " tandem does not support: " + list +
                      ". It reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K: files made with llama-quantize's "
                      "F32, F16, BF16, Q8_0, Q4_0, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M or Q6_K load (with row lengths that "
                      "are multiples of 256 for the K types)");
  }

  const uint64_t data_start = (uint64_t(c.pos()) + alignment - 1) / alignment * alignment;
  if (!tensors_.empty() && data_start > size)
    malformed("file is truncated: tensor data section starts at " + std::to_string(data_start) +
              " past the end of the file (" + std::to_string(size) + " bytes)");
  const uint64_t data_size = size - std::min<uint64_t>(data_start, size);
  std::map<std::string_view, int> seen;
  for (auto& ti : tensors_) {
    if (!seen.emplace(ti.name, 0).second) malformed("tensor '" + ti.name + "' appears twice");
    if (ti.offset > data_size || ti.size_bytes > data_size - ti.offset)
      malformed("tensor '" + ti.name + "' data [" + std::to_string(ti.offset) + ", " +
                std::to_string(ti.offset + ti.size_bytes) + ") lies outside the data section (" +
                std::to_string(data_size) + " bytes): file truncated or offset corrupt");
    ti.data = base + data_start + ti.offset;
  }
  // No two tensors share bytes: a writer lays them out one after the other, and a file whose
  // offsets overlap was corrupted (it would load and compute garbage).
  std::vector<const tensor_info*> by_offset;
  for (const auto& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const tensor_info& a = *by_offset[i - 1];
    const tensor_info& b = *by_offset[i];
    if (a.size_bytes > 0 && b.offset < a.offset + a.size_bytes)
      malformed("tensors '" + a.name + "' [" + std::to_string(a.offset) + ", " +
                std::to_string(a.offset + a.size_bytes) + ") and '" + b.name + "' [" + std::to_string(b.offset) + ", " +
                std::to_string(b.offset + b.size_bytes) + ") overlap in the data section: offsets corrupt");
  }
}

const tensor_info* file::find_tensor(std::string_view name) const {
  for (auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const value* file::find(std::string_view key) const {
  auto i = kv_.find(std::string(key));
  return i == kv_.end() ? nullptr : &i->second;
}

static const value& require(const file& f, std::string_view key) {
  const value* v = f.find(key);
  if (!v) throw failure(errc::missing_key, "metadata key '" + std::string(key) + "' is missing");
  return *v;
}

static uint64_t as_uint(std::string_view key, const value& v) {
  if (v.is_unsigned()) return v.u;
  if (v.is_signed()) {
    if (v.i < 0) malformed("metadata key '" + std::string(key) + "' is negative");
    return uint64_t(v.i);
  }
  wrong_type(key, v, "an integer");
}

static double as_float(std::string_view key, const value& v) {
  if (v.is_float()) return v.f;
  if (v.is_unsigned()) return double(v.u);
  if (v.is_signed()) return double(v.i);
  wrong_type(key, v, "a number");
}

uint64_t file::get_uint(std::string_view key) const { return as_uint(key, require(*this, key)); }
uint64_t file::get_uint(std::string_view key, uint64_t def) const {
  const value* v = find(key);
  return v ? as_uint(key, *v) : def;
}
double file::get_float(std::string_view key) const { return as_float(key, require(*this, key)); }
double file::get_float(std::string_view key, double def) const {
  const value* v = find(key);
  return v ? as_float(key, *v) : def;
}
std::string file::get_string(std::string_view key) const {
  const value& v = require(*this, key);
  if (v.type == value_type::string) return v.s;
  wrong_type(key, v, "a string");
}
std::string file::get_string(std::string_view key, std::string def) const {
  return find(key) ? get_string(key) : std::move(def);
}
bool file::get_bool(std::string_view key, bool def) const {
  const value* v = find(key);
  if (!v) return def;
  if (v->type == value_type::boolean) return v->b;
  wrong_type(key, *v, "a bool");
}

static const array& as_array(std::string_view key, const value& v) {
  if (v.type == value_type::array && v.arr) return *v.arr;
  wrong_type(key, v, "an array");
}

std::vector<std::string> file::get_string_array(std::string_view key) const {
  std::vector<std::string> out;
  for (auto& e : as_array(key, require(*this, key))) {
    if (e.type != value_type::string) malformed("metadata key '" + std::string(key) + "' must be an array of strings");
    out.push_back(e.s);
  }
  return out;
}
std::vector<float> file::get_float_array(std::string_view key) const {
  std::vector<float> out;
  for (auto& e : as_array(key, require(*this, key))) out.push_back(float(as_float(key, e)));
  return out;
}
std::vector<int32_t> file::get_int_array(std::string_view key) const {
  std::vector<int32_t> out;
  for (auto& e : as_array(key, require(*this, key))) {
    if (e.is_signed()) out.push_back(int32_t(e.i));
    else if (e.is_unsigned()) out.push_back(int32_t(e.u));
    else malformed("metadata key '" + std::string(key) + "' must be an array of integers");
  }
  return out;
}

// ---- writer ----

void writer::set(const std::string& key, value v) {
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}
void writer::set_u32(const std::string& k, uint32_t x) { set(k, value::of_u(value_type::u32, x)); }
void writer::set_i32(const std::string& k, int32_t x) { set(k, value::of_i(value_type::i32, x)); }
void writer::set_f32(const std::string& k, float x) { set(k, value::of_f(value_type::f32, x)); }
void writer::set_bool(const std::string& k, bool x) { set(k, value::of_bool(x)); }
void writer::set_string(const std::string& k, std::string s) { set(k, value::of_string(std::move(s))); }
void writer::set_strings(const std::string& k, const std::vector<std::string>& xs) {
  auto a = std::make_shared<array>();
  for (auto& s : xs) a->push_back(value::of_string(s));
  set(k, value::of_array(value_type::string, a));
}
void writer::set_f32s(const std::string& k, const std::vector<float>& xs) {
  auto a = std::make_shared<array>();
  for (float x : xs) a->push_back(value::of_f(value_type::f32, x));
  set(k, value::of_array(value_type::f32, a));
}
void writer::set_i32s(const std::string& k, const std::vector<int32_t>& xs) {
  auto a = std::make_shared<array>();
  for (int32_t x : xs) a->push_back(value::of_i(value_type::i32, x));
  set(k, value::of_array(value_type::i32, a));
}

void writer::add_tensor(const std::string& name, std::vector<int64_t> shape, kernels::dtype type,
                        std::vector<uint8_t> bytes) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (shape.empty() || shape[0] % kernels::block_elems(type) != 0 ||
      int64_t(bytes.size()) != n / kernels::block_elems(type) * kernels::block_bytes(type))
    throw failure(errc::invalid_argument, "tensor '" + name + "': data size does not match its shape and type");
  tensors_.push_back({name, std::move(shape), type, std::move(bytes)});
}

namespace {
struct out_buf {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void put_value(const value& v) {
    switch (v.type) {
      case value_type::u8: put<uint8_t>(uint8_t(v.u)); break;
      case value_type::u16: put<uint16_t>(uint16_t(v.u)); break;
      case value_type::u32: put<uint32_t>(uint32_t(v.u)); break;
      case value_type::u64: put<uint64_t>(v.u); break;
      case value_type::i8: put<int8_t>(int8_t(v.i)); break;
      case value_type::i16: put<int16_t>(int16_t(v.i)); break;
      case value_type::i32: put<int32_t>(int32_t(v.i)); break;
      case value_type::i64: put<int64_t>(v.i); break;
      case value_type::f32: put<float>(float(v.f)); break;
      case value_type::f64: put<double>(v.f); break;
      case value_type::boolean: put<uint8_t>(v.b ? 1 : 0); break;
      case value_type::string: put_string(v.s); break;
      case value_type::array: {
        const auto& a = *v.arr;
        put<uint32_t>(uint32_t(v.elem_type));
        put<uint64_t>(a.size());
        for (auto& e : a) put_value(e);
        break;
      }
    }
  }
  void pad(uint64_t alignment) {
    while (b.size() % alignment) b.push_back(0);
  }
};
}  // namespace

void writer::write(const std::string& path, uint32_t alignment) const {
  out_buf h;
  h.put<uint32_t>(gguf_magic);
  h.put<uint32_t>(3);
  h.put<uint64_t>(tensors_.size());
  const bool custom_alignment = alignment != 32;
  h.put<uint64_t>(kv_.size() + (custom_alignment ? 1 : 0));
  for (auto& [k, v] : kv_) {
    h.put_string(k);
    h.put<uint32_t>(uint32_t(v.type));
    h.put_value(v);
  }
  if (custom_alignment) {
    h.put_string("general.alignment");
    h.put<uint32_t>(uint32_t(value_type::u32));
    h.put<uint32_t>(alignment);
  }
  uint64_t offset = 0;
  for (auto& t : tensors_) {
    h.put_string(t.name);
    h.put<uint32_t>(uint32_t(t.shape.size()));
    for (auto d : t.shape) h.put<uint64_t>(uint64_t(d));
    h.put<uint32_t>(uint32_t(t.type));
    h.put<uint64_t>(offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  h.pad(alignment);

  // Atomic: two processes making the same file never collide, and a reader never sees a part.
  write_file_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(h.b.data()), std::streamsize(h.b.size()));
    static const char zeros[256] = {};
    for (auto& t : tensors_) {
      out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
      const size_t pad = (alignment - t.bytes.size() % alignment) % alignment;
      out.write(zeros, std::streamsize(pad));
    }
  });
}

}  // namespace tandem::gguf
