// Evaluator of the Jinja interpreter: expressions, statements, scopes, macros and loops, with
// Python's operator semantics. Undefined values follow Jinja2's default Undefined (print as
// nothing, falsy, iterate as empty) but attribute access on them is lenient, as in llama.cpp:
// `undefined.attr` is undefined instead of an error, so `x.y is defined` works on a missing x.
#include <cmath>

#include "runtime/text/jinja_internal.h"

namespace tandem::jinja::detail {

// Errors raised without a position (deep in a builtin) get the position of the node at hand.
template <class F>
static auto at(source_pos pos, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (template_error& e) {
    if (e.pos.line == 0) e.pos = pos;
    throw;
  }
}

const value* frame::find(std::string_view name) const {
  for (const frame* f = this; f; f = f->parent.get())
    for (const auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void frame::set(const std::string& name, value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

evaluator::evaluator(const render_options& options, std::shared_ptr<frame> globals)
    : options_(options), globals_(std::move(globals)) {
  scope_ = std::make_shared<frame>();
  scope_->parent = globals_;
}

evaluator::depth_guard::depth_guard(evaluator& e, source_pos pos) : ev(e) {
  if (++ev.depth_ > max_depth) {
    --ev.depth_;
    fail("recursion deeper than " + std::to_string(max_depth) + " levels", pos);
  }
}

value evaluator::lookup(const std::string& name, source_pos) const {
  if (const value* v = scope_->find(name)) return *v;
  if (const value* g = find_global(name)) return *g;
  return value();
}

void evaluator::assign(const target& t, const value& v, source_pos pos) {
  if (!t.name.empty()) {
    scope_->set(t.name, v);
    return;
  }
  std::vector<value> chars;  // a string or dict unpacks into its characters or keys
  if (v.is_string() || v.is_dict()) {
    if (v.is_string())
      for (auto c : utf8_chars(v.str())) chars.emplace_back(std::string(c));
    else
      for (const auto& [k, x] : v.dict().items) chars.emplace_back(k);
  } else if (!v.is_list()) {
    fail("cannot unpack non-sequence " + std::string(type_name(v)), pos);
  }
  const auto& items = v.is_list() ? v.list().items : chars;
  if (items.size() != t.elements.size())
    fail("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(t.elements.size()) +
             " names",
         pos);
  for (size_t i = 0; i < items.size(); ++i) assign(t.elements[i], items[i], pos);
}

void evaluator::emit(std::string_view text) {
  if (out_->size() + text.size() > options_.max_output_bytes)
    fail("output exceeds " + std::to_string(options_.max_output_bytes) + " bytes");
  out_->append(text);
}

void evaluator::step(source_pos pos) {
  if (++steps_ > options_.max_steps)
    fail("template ran more than " + std::to_string(options_.max_steps) + " steps", pos);
}

void evaluator::exec_body(const body& b) {
  for (const auto& s : b) {
    step(s->pos);
    at(s->pos, [&] { s->exec(*this); });
  }
}

std::string evaluator::capture(const std::function<void()>& fn) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    fn();
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

value evaluator::call(const value& callee, call_args& args, source_pos pos) {
  if (!callee.is_callable()) fail("'" + std::string(type_name(callee)) + "' object is not callable", pos);
  step(pos);
  args.pos = pos;
  return at(pos, [&] { return callee.callable().fn(*this, args); });
}

value evaluator::get_attr(const value& obj, const std::string& name, source_pos) {
  if (obj.is_dict()) {
    // Jinja2 tries the Python attribute first, so `d.items` is the method even if d has a key
    // "items"; a namespace has only its attributes.
    if (!obj.dict().is_namespace) {
      value m = find_method(obj, name);
      if (!m.is_undefined()) return m;
    }
    if (const value* v = obj.dict().find(name)) return *v;
    return value();
  }
  return find_method(obj, name);
}

static bool as_index(const value& key, int64_t* out) {
  if (key.is_int()) *out = key.as_int();
  else if (key.is_bool()) *out = key.as_bool();
  else return false;
  return true;
}

value evaluator::get_item(const value& obj, const value& key, source_pos) {
  // Jinja2's subscript tries the item first, then the attribute; a miss is undefined.
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const value* v = obj.dict().find(key.str())) return *v;
      if (!obj.dict().is_namespace) return find_method(obj, key.str());
    }
    return value();
  }
  int64_t i;
  if (obj.is_list() && as_index(key, &i)) {
    const auto& items = obj.list().items;
    if (i < 0) i += int64_t(items.size());
    if (i < 0 || i >= int64_t(items.size())) return value();
    return items[size_t(i)];
  }
  if (obj.is_string() && as_index(key, &i)) {
    auto chars = utf8_chars(obj.str());
    if (i < 0) i += int64_t(chars.size());
    if (i < 0 || i >= int64_t(chars.size())) return value();
    return value(std::string(chars[size_t(i)]));
  }
  if (key.is_string()) return find_method(obj, key.str());
  return value();
}

value evaluator::apply_filter(const std::string& name, const value& input, call_args& args) {
  return call_filter(*this, name, input, args);
}

bool evaluator::apply_test(const std::string& name, const value& input, call_args& args) {
  return call_test(*this, name, input, args);
}

// ---- expressions ----

value name_expr::eval(evaluator& ev) const { return ev.lookup(name, pos); }

value list_expr::eval(evaluator& ev) const {
  std::vector<value> out;
  out.reserve(items.size());
  for (const auto& e : items) out.push_back(e->eval(ev));
  return at(pos, [&] { return make_list(std::move(out), tuple); });
}

value dict_expr::eval(evaluator& ev) const {
  std::vector<std::pair<std::string, value>> out;
  for (const auto& [k, v] : items) {
    value key = k->eval(ev);
    // Keys are strings in every chat template; other scalars are stored by their str().
    if (!key.is_string() && !key.is_number() && !key.is_none())
      fail("unhashable dict key of type '" + std::string(type_name(key)) + "'", k->pos);
    out.emplace_back(to_str(key), v->eval(ev));
  }
  return at(pos, [&] { return make_dict(std::move(out)); });
}

value attr_expr::eval(evaluator& ev) const { return ev.get_attr(obj->eval(ev), name, pos); }

value index_expr::eval(evaluator& ev) const {
  value o = obj->eval(ev);
  return ev.get_item(o, key->eval(ev), pos);
}

// Python's slice index normalisation for a sequence of length n.
static std::vector<size_t> slice_indices(int64_t n, const value& start, const value& stop, const value& step,
                                         source_pos pos) {
  auto get = [&](const value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    int64_t i;
    if (!as_index(v, &i)) fail(std::string("slice ") + what + " must be an integer", pos);
    return i;
  };
  int64_t st = get(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero", pos);
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t i = *v;
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(get(start, "start"), st > 0 ? 0 : n - 1);
  int64_t e = clamp(get(stop, "stop"), st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(size_t(i));
  return out;
}

value slice_expr::eval(evaluator& ev) const {
  value o = obj->eval(ev);
  auto part = [&](const expr_ptr& e) { return e ? e->eval(ev) : value(); };
  value b = part(start), e = part(stop), s = part(step);
  if (o.is_list()) {
    const auto& items = o.list().items;
    std::vector<value> out;
    for (size_t i : slice_indices(int64_t(items.size()), b, e, s, pos)) out.push_back(items[i]);
    return make_list(std::move(out), o.list().tuple);
  }
  if (o.is_string()) {
    auto chars = utf8_chars(o.str());
    std::string out;
    for (size_t i : slice_indices(int64_t(chars.size()), b, e, s, pos)) out += chars[i];
    return value(std::move(out));
  }
  if (o.is_undefined()) return value();
  fail("'" + std::string(type_name(o)) + "' object is not subscriptable", pos);
}

static void eval_args(evaluator& ev, const std::vector<expr_ptr>& args,
                      const std::vector<std::pair<std::string, expr_ptr>>& kwargs, call_args& out) {
  for (const auto& a : args) out.args.push_back(a->eval(ev));
  for (const auto& [k, v] : kwargs) out.kwargs.emplace_back(k, v->eval(ev));
}

value call_expr::eval(evaluator& ev) const {
  value f = callee->eval(ev);
  if (f.is_undefined()) {
    if (auto* n = dynamic_cast<const name_expr*>(callee.get())) fail("'" + n->name + "' is undefined", pos);
    if (auto* a = dynamic_cast<const attr_expr*>(callee.get())) {
      value o = a->obj->eval(ev);
      fail("'" + std::string(type_name(o)) + "' object has no attribute '" + a->name + "'", pos);
    }
  }
  call_args ca;
  eval_args(ev, args, kwargs, ca);
  return ev.call(f, ca, pos);
}

value filter_expr::eval(evaluator& ev) const {
  value in = operand->eval(ev);
  call_args ca;
  ca.pos = pos;
  eval_args(ev, args, kwargs, ca);
  return at(pos, [&] { return ev.apply_filter(name, in, ca); });
}

value test_expr::eval(evaluator& ev) const {
  value in = operand->eval(ev);
  call_args ca;
  ca.pos = pos;
  for (const auto& a : args) ca.args.push_back(a->eval(ev));
  bool r = at(pos, [&] { return ev.apply_test(name, in, ca); });
  return value(negated ? !r : r);
}

static bool int_like(const value& v) { return v.is_int() || v.is_bool(); }
static int64_t int_of(const value& v) { return v.is_int() ? v.as_int() : int64_t(v.as_bool()); }
static double float_of(const value& v) { return v.is_float() ? v.as_float() : double(int_of(v)); }

value unary_expr::eval(evaluator& ev) const {
  value v = operand->eval(ev);
  if (op == unary_op::not_) return value(!truthy(v));
  if (int_like(v)) {
    int64_t i = int_of(v);
    if (op == unary_op::neg && i == INT64_MIN) fail("integer overflow", pos);
    return value(op == unary_op::neg ? -i : i);
  }
  if (v.is_float()) return value(op == unary_op::neg ? -v.as_float() : v.as_float());
  fail(std::string("bad operand type for unary ") + (op == unary_op::neg ? "-" : "+") + ": '" +
           std::string(type_name(v)) + "'",
       pos);
}

[[noreturn]] static void bad_operands(const char* op, const value& a, const value& b, source_pos pos) {
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + std::string(type_name(a)) + "' and '" +
           std::string(type_name(b)) + "'",
       pos);
}

static value repeat(const value& seq, int64_t n, evaluator& ev, source_pos pos) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (seq.str().size() * uint64_t(n) > ev.options().max_output_bytes) fail("string repetition too long", pos);
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return value(std::move(out));
  }
  const auto& items = seq.list().items;
  if (items.size() * uint64_t(n) > max_list_size) fail("list repetition too long", pos);
  std::vector<value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return make_list(std::move(out), seq.list().tuple);
}

static value arith(binary_op op, const value& a, const value& b, evaluator& ev, source_pos pos) {
  const char* sym = op == binary_op::add        ? "+"
                    : op == binary_op::sub      ? "-"
                    : op == binary_op::mul      ? "*"
                    : op == binary_op::div      ? "/"
                    : op == binary_op::floordiv ? "//"
                    : op == binary_op::mod      ? "%"
                                                : "**";
  if (a.is_number() && b.is_number()) {
    if (int_like(a) && int_like(b) && op != binary_op::div) {
      int64_t x = int_of(a), y = int_of(b), r = 0;
      switch (op) {
        case binary_op::add:
          if (__builtin_add_overflow(x, y, &r)) fail("integer overflow", pos);
          return value(r);
        case binary_op::sub:
          if (__builtin_sub_overflow(x, y, &r)) fail("integer overflow", pos);
          return value(r);
        case binary_op::mul:
          if (__builtin_mul_overflow(x, y, &r)) fail("integer overflow", pos);
          return value(r);
        case binary_op::floordiv:
        case binary_op::mod: {
          if (y == 0) fail("integer division or modulo by zero", pos);
          if (x == INT64_MIN && y == -1) fail("integer overflow", pos);
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
            --q;
            m += y;
          }
          return value(op == binary_op::floordiv ? q : m);
        }
        case binary_op::pow: {
          if (y < 0) return value(std::pow(double(x), double(y)));
          int64_t acc = 1, base = x;  // square-and-multiply, failing on overflow
          for (int64_t e = y; e > 0; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) fail("integer overflow", pos);
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow", pos);
          }
          return value(acc);
        }
        default: break;
      }
    }
    double x = float_of(a), y = float_of(b);
    switch (op) {
      case binary_op::add: return value(x + y);
      case binary_op::sub: return value(x - y);
      case binary_op::mul: return value(x * y);
      case binary_op::div:
        if (y == 0) fail("division by zero", pos);
        return value(x / y);
      case binary_op::floordiv:
        if (y == 0) fail("float floor division by zero", pos);
        return value(std::floor(x / y));
      case binary_op::mod: {
        if (y == 0) fail("float modulo by zero", pos);
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return value(m);
      }
      case binary_op::pow: return value(std::pow(x, y));
      default: break;
    }
  }
  if (op == binary_op::add) {
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > ev.options().max_output_bytes) fail("string too long", pos);
      return value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.list().tuple == b.list().tuple) {
      std::vector<value> out = a.list().items;
      if (out.size() + b.list().items.size() > max_list_size) fail("list too long", pos);
      out.insert(out.end(), b.list().items.begin(), b.list().items.end());
      return make_list(std::move(out), a.list().tuple);
    }
  }
  if (op == binary_op::mul) {
    if ((a.is_string() || a.is_list()) && int_like(b)) return repeat(a, int_of(b), ev, pos);
    if ((b.is_string() || b.is_list()) && int_like(a)) return repeat(b, int_of(a), ev, pos);
  }
  if (op == binary_op::mod && a.is_string()) {
    // printf-style formatting, as Python's str % args.
    call_args ca;
    ca.pos = pos;
    if (b.is_list() && b.list().tuple) ca.args = b.list().items;
    else ca.args.push_back(b);
    return call_filter(ev, "format", a, ca);
  }
  bad_operands(sym, a, b, pos);
}

value binary_expr::eval(evaluator& ev) const {
  if (op == binary_op::and_) {
    value l = left->eval(ev);
    return truthy(l) ? right->eval(ev) : l;
  }
  if (op == binary_op::or_) {
    value l = left->eval(ev);
    return truthy(l) ? l : right->eval(ev);
  }
  value l = left->eval(ev);
  value r = right->eval(ev);
  if (op == binary_op::concat) {
    std::string s = to_str(l);
    std::string t = to_str(r);
    if (s.size() + t.size() > ev.options().max_output_bytes) fail("string too long", pos);
    return value(s + t);
  }
  return arith(op, l, r, ev, pos);
}

static bool contains(const value& container, const value& item, source_pos pos) {
  if (container.is_string()) {
    if (!item.is_string())
      fail("'in <string>' requires string as left operand, not " + std::string(type_name(item)), pos);
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& v : container.list().items)
      if (equals(v, item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict().find(item.str()) != nullptr;
  if (container.is_undefined()) return false;
  fail("argument of type '" + std::string(type_name(container)) + "' is not iterable", pos);
}

value compare_expr::eval(evaluator& ev) const {
  value l = first->eval(ev);
  for (const auto& [op, e] : rest) {
    value r = e->eval(ev);
    bool ok;
    switch (op) {
      case compare_op::eq: ok = equals(l, r); break;
      case compare_op::ne: ok = !equals(l, r); break;
      case compare_op::lt: ok = compare(l, r, pos) < 0; break;
      case compare_op::le: ok = compare(l, r, pos) <= 0; break;
      case compare_op::gt: ok = compare(l, r, pos) > 0; break;
      case compare_op::ge: ok = compare(l, r, pos) >= 0; break;
      case compare_op::in: ok = contains(r, l, pos); break;
      case compare_op::not_in: ok = !contains(r, l, pos); break;
      default: ok = false;
    }
    if (!ok) return value(false);
    l = std::move(r);
  }
  return value(true);
}

value cond_expr::eval(evaluator& ev) const {
  if (truthy(cond->eval(ev))) return then->eval(ev);
  return otherwise ? otherwise->eval(ev) : value();
}

// ---- statements ----

void text_stmt::exec(evaluator& ev) const { ev.emit(text); }

void output_stmt::exec(evaluator& ev) const { ev.emit(to_str(value_->eval(ev))); }

void if_stmt::exec(evaluator& ev) const {
  for (const auto& [cond, b] : branches)
    if (truthy(cond->eval(ev))) {
      ev.exec_body(b);
      return;
    }
  ev.exec_body(otherwise);
}

// The items a for loop (or a filter) walks: a list's items, a dict's keys, a string's characters.
static std::vector<value> iterate(const value& v, source_pos pos) { return items_of(v, pos); }

void for_stmt::exec(evaluator& ev) const {
  std::vector<value> items = iterate(iterable->eval(ev), pos);
  if (filter) {
    std::vector<value> kept;
    for (auto& it : items) {
      ev.step(pos);
      bool keep = false;
      ev.with_scope(nullptr, [&] {
        ev.assign(var, it, pos);
        keep = truthy(filter->eval(ev));
      });
      if (keep) kept.push_back(std::move(it));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    ev.exec_body(otherwise);
    return;
  }
  evaluator::depth_guard guard(ev, pos);
  const int64_t n = int64_t(items.size());
  for (int64_t i = 0; i < n; ++i) {
    ev.step(pos);
    bool stop = false;
    ev.with_scope(nullptr, [&] {
      ev.assign(var, items[size_t(i)], pos);
      std::vector<std::pair<std::string, value>> loop = {{"index", value(i + 1)},    {"index0", value(i)},
                                                         {"revindex", value(n - i)}, {"revindex0", value(n - i - 1)},
                                                         {"first", value(i == 0)},   {"last", value(i == n - 1)},
                                                         {"length", value(n)},       {"depth", value(1)},
                                                         {"depth0", value(0)}};  // no recursive loops
      if (i > 0) loop.emplace_back("previtem", items[size_t(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[size_t(i + 1)]);
      loop.emplace_back("cycle", make_callable("cycle", [i](evaluator&, call_args& a) {
                          if (a.args.empty()) fail("loop.cycle() needs at least one argument");
                          return a.args[size_t(i) % a.args.size()];
                        }));
      ev.scope()->set("loop", make_dict(std::move(loop)));
      try {
        ev.exec_body(body_);
      } catch (const loop_signal& s) {
        if (s.kind == loop_control::break_) stop = true;
      }
    });
    if (stop) break;
  }
}

static bool holds_namespace(const value& v, int depth = 0) {
  if (depth > 2 * max_depth) return true;
  if (v.is_dict()) {
    if (v.dict().is_namespace) return true;
    for (const auto& [k, x] : v.dict().items)
      if (holds_namespace(x, depth + 1)) return true;
  } else if (v.is_list()) {
    for (const auto& x : v.list().items)
      if (holds_namespace(x, depth + 1)) return true;
  }
  return false;
}

void set_stmt::exec(evaluator& ev) const {
  value v = value_->eval(ev);
  if (ns_attr.empty()) {
    ev.assign(var, v, pos);
    return;
  }
  value ns = ev.lookup(var.name, pos);
  if (!ns.is_dict() || !ns.dict().is_namespace)
    fail("cannot assign attribute '" + ns_attr + "' on '" + var.name + "': not a namespace", pos);
  // No cycles: a namespace never holds a namespace (directly or inside a list or dict).
  if (holds_namespace(v)) fail("a namespace attribute cannot hold a namespace", pos);
  if (depth_of(v) + 1 > max_depth) fail("values nest deeper than " + std::to_string(max_depth) + " levels", pos);
  auto& d = ns.dict();
  d.set(ns_attr, std::move(v));
  d.depth = std::max(d.depth, depth_of(*d.find(ns_attr)) + 1);
}

static value apply_filters(evaluator& ev, const std::vector<filter_call>& filters, value v) {
  for (const auto& f : filters) {
    call_args ca;
    ca.pos = f.pos;
    eval_args(ev, f.args, f.kwargs, ca);
    v = at(f.pos, [&] { return ev.apply_filter(f.name, v, ca); });
  }
  return v;
}

void set_block_stmt::exec(evaluator& ev) const {
  std::string s = ev.capture([&] { ev.exec_body(body_); });
  ev.scope()->set(name, apply_filters(ev, filters, value(std::move(s))));
}

void filter_block_stmt::exec(evaluator& ev) const {
  std::string s = ev.capture([&] { ev.exec_body(body_); });
  ev.emit(to_str(apply_filters(ev, filters, value(std::move(s)))));
}

void block_stmt::exec(evaluator& ev) const { ev.exec_body(body_); }

void loop_control_stmt::exec(evaluator&) const { throw loop_signal{kind}; }

// Binds a macro's (or caller's) parameters in the current scope: positional, then keywords, then
// defaults; surplus goes to `varargs` and `kwargs`, as in Jinja2.
static void bind_params(evaluator& ev, const std::vector<macro_param>& params, call_args& a, const std::string& what) {
  std::vector<value> extra;
  for (size_t i = 0; i < a.args.size(); ++i) {
    if (i < params.size()) ev.scope()->set(params[i].name, a.args[i]);
    else extra.push_back(a.args[i]);
  }
  std::vector<std::pair<std::string, value>> extra_kw;
  for (auto& [k, v] : a.kwargs) {
    bool found = false;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].name == k) {
        if (i < a.args.size()) fail(what + "() got multiple values for argument '" + k + "'", a.pos);
        ev.scope()->set(k, v);
        found = true;
      }
    if (!found && k != "caller") extra_kw.emplace_back(k, v);
    if (k == "caller") ev.scope()->set("caller", v);
  }
  for (size_t i = a.args.size(); i < params.size(); ++i) {
    bool given = false;
    for (auto& [k, v] : a.kwargs) given = given || k == params[i].name;
    if (!given) ev.scope()->set(params[i].name, params[i].default_ ? params[i].default_->eval(ev) : value());
  }
  ev.scope()->set("varargs", make_list(std::move(extra), true));
  ev.scope()->set("kwargs", make_dict(std::move(extra_kw)));
}

// Runs a macro-like body in a fresh scope under `parent` and returns what it printed.
static value run_callable_body(evaluator& ev, std::shared_ptr<frame> parent, const std::vector<macro_param>& params,
                               const body& b, call_args& a, const std::string& name, source_pos pos) {
  evaluator::depth_guard guard(ev, pos);
  std::string out;
  try {
    ev.with_scope(std::move(parent), [&] {
      bind_params(ev, params, a, name);
      out = ev.capture([&] { ev.exec_body(b); });
    });
  } catch (const loop_signal&) {
    fail("'break' or 'continue' outside a loop in '" + name + "'", pos);
  }
  return value(std::move(out));
}

void macro_stmt::exec(evaluator& ev) const {
  // The macro sees the scope it was defined in (weakly held: a frame holding the macro must not
  // be kept alive by it); if that scope is gone, the template's top level.
  std::weak_ptr<frame> def = ev.scope();
  const macro_stmt* self = this;
  ev.scope()->set(name, make_callable(name, [def, self](evaluator& e, call_args& a) {
                    auto parent = def.lock();
                    if (!parent) parent = e.globals();
                    return run_callable_body(e, parent, self->params, self->body_, a, self->name, a.pos);
                  }));
}

void call_block_stmt::exec(evaluator& ev) const {
  std::weak_ptr<frame> def = ev.scope();
  const call_block_stmt* self = this;
  value caller = make_callable("caller", [def, self](evaluator& e, call_args& a) {
    auto parent = def.lock();
    if (!parent) parent = e.globals();
    return run_callable_body(e, parent, self->caller_params, self->body_, a, "caller", a.pos);
  });
  value f = call->callee->eval(ev);
  call_args ca;
  eval_args(ev, call->args, call->kwargs, ca);
  ca.kwargs.emplace_back("caller", caller);
  ev.emit(to_str(ev.call(f, ca, pos)));
}

std::string render_program(const program_ast& prog, value context, const render_options& options) {
  auto globals = std::make_shared<frame>();
  if (context.is_dict())
    for (const auto& [k, v] : context.dict().items) globals->vars.emplace_back(k, v);
  evaluator ev(options, globals);
  try {
    ev.exec_body(prog.root);
  } catch (const loop_signal&) {
    fail("'break' or 'continue' outside a loop");
  }
  return std::move(ev.root_out_);
}

}  // namespace tandem::jinja::detail
