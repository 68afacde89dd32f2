#pragma once
// Internals of the Jinja interpreter (runtime/text/jinja.h): the value model, the syntax tree and the
// evaluator. Shared by jinja_value.cpp, jinja_parse.cpp, jinja_eval.cpp and jinja_builtins.cpp;
// nothing outside those files includes it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/text/jinja.h"

namespace tandem::jinja::detail {

// Nesting bound for the parser, for containers and for the evaluator's recursion (macro calls,
// nested blocks): deep enough for any real template, shallow enough for the stack.
inline constexpr int max_depth = 256;
// Bound on the elements of one list (range(), list concatenation, repetition).
inline constexpr size_t max_list_size = size_t{1} << 20;

// Where in the template source a node or an error is: 1-based line and column.
struct source_pos {
  int line = 0;
  int col = 0;
};

// Every error inside the interpreter is one of these; the public API turns it into a
// tandem::failure with "template line L col C: " in front when a position is known.
struct template_error {
  std::string message;
  source_pos pos;
  bool raised = false;  // from raise_exception(): the message goes out verbatim after raised_prefix
};
[[noreturn]] void fail(std::string message, source_pos pos = {});

// ---- values -------------------------------------------------------------------------------------
// Python-like values. Lists and dicts are shared (copying a value is cheap) and immutable once
// built, except a namespace()'s attributes, which `{% set ns.x = ... %}` changes in place. A
// namespace may not hold another namespace, so values never form cycles.

struct value;
struct list_obj;
struct dict_obj;
struct callable_obj;

struct undefined_t {
  bool operator==(const undefined_t&) const = default;
};
struct none_t {
  bool operator==(const none_t&) const = default;
};

struct value {
  std::variant<undefined_t, none_t, bool, int64_t, double, std::string, std::shared_ptr<list_obj>,
               std::shared_ptr<dict_obj>, std::shared_ptr<callable_obj>>
      v;

  value() = default;
  value(none_t n) : v(n) {}
  value(bool b) : v(b) {}
  value(int64_t i) : v(i) {}
  value(int i) : v(int64_t{i}) {}
  value(double d) : v(d) {}
  value(std::string s) : v(std::move(s)) {}
  value(const char* s) : v(std::string(s)) {}
  value(std::string_view s) : v(std::string(s)) {}
  value(std::shared_ptr<list_obj> l) : v(std::move(l)) {}
  value(std::shared_ptr<dict_obj> d) : v(std::move(d)) {}
  value(std::shared_ptr<callable_obj> c) : v(std::move(c)) {}

  bool is_undefined() const { return std::holds_alternative<undefined_t>(v); }
  bool is_none() const { return std::holds_alternative<none_t>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // bool is an int in Python
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<std::shared_ptr<list_obj>>(v); }
  bool is_dict() const { return std::holds_alternative<std::shared_ptr<dict_obj>>(v); }
  bool is_callable() const { return std::holds_alternative<std::shared_ptr<callable_obj>>(v); }

  bool as_bool() const { return std::get<bool>(v); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_float() const { return std::get<double>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  const list_obj& list() const { return *std::get<std::shared_ptr<list_obj>>(v); }
  const std::shared_ptr<list_obj>& list_ptr() const { return std::get<std::shared_ptr<list_obj>>(v); }
  dict_obj& dict() const { return *std::get<std::shared_ptr<dict_obj>>(v); }
  const std::shared_ptr<dict_obj>& dict_ptr() const { return std::get<std::shared_ptr<dict_obj>>(v); }
  const callable_obj& callable() const { return *std::get<std::shared_ptr<callable_obj>>(v); }
};

struct list_obj {
  std::vector<value> items;
  bool tuple = false;  // printed as (a, b); otherwise the same as a list
  int depth = 1;  // nesting depth, bounded by max_depth
};

struct dict_obj {
  std::vector<std::pair<std::string, value>> items;  // insertion order, as Python dicts
  bool is_namespace = false;  // namespace(): attributes may be set
  int depth = 1;

  const value* find(std::string_view key) const;
  void set(const std::string& key, value v);
};

// Positional and keyword arguments of a call, already evaluated.
struct call_args {
  std::vector<value> args;
  std::vector<std::pair<std::string, value>> kwargs;
  source_pos pos;
};

class evaluator;
struct callable_obj {
  std::string name;  // for messages and printing
  std::function<value(evaluator&, call_args&)> fn;
};

// Constructors that keep depth bounded; every container the interpreter builds goes through them.
value make_list(std::vector<value> items, bool tuple = false);
value make_dict(std::vector<std::pair<std::string, value>> items, bool is_namespace = false);
value make_callable(std::string name, std::function<value(evaluator&, call_args&)> fn);
int depth_of(const value& v);

value from_json(const nlohmann::ordered_json& j, int depth = 0);
value from_json(const nlohmann::json& j, int depth = 0);

// Python semantics on values (jinja_value.cpp).
std::string_view type_name(const value& v);  // Python's name: str, int, list, dict, NoneType ...
bool truthy(const value& v);
std::string to_str(const value& v);  // str(v): what {{ v }} prints
std::string to_repr(const value& v);  // repr(v): how v prints inside a list
bool equals(const value& a, const value& b);
int compare(const value& a, const value& b, source_pos pos);  // <0, 0, >0; type error if unordered
struct json_format {
  int indent = -1;  // < 0: one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep = ", ";  // json.dumps' defaults; with indent, "," before the newline
  std::string key_sep = ": ";
};
std::string to_json(const value& v, const json_format& fmt, source_pos pos);
std::string format_float(double d);  // Python's repr(float)

// UTF-8 helpers: Python strings count and slice code points.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
bool is_py_space(std::string_view s, size_t i, size_t* len);  // str.isspace() for the char at i

// ---- syntax tree --------------------------------------------------------------------------------

struct expr {
  source_pos pos;
  virtual ~expr() = default;
  virtual value eval(evaluator& ev) const = 0;
};
using expr_ptr = std::unique_ptr<expr>;

struct stmt {
  source_pos pos;
  virtual ~stmt() = default;
  virtual void exec(evaluator& ev) const = 0;
};
using stmt_ptr = std::unique_ptr<stmt>;
using body = std::vector<stmt_ptr>;

// Expression nodes.
struct literal_expr : expr {
  value val;
  value eval(evaluator&) const override { return val; }
};
struct name_expr : expr {
  std::string name;
  value eval(evaluator& ev) const override;
};
struct list_expr : expr {  // [a, b] and (a, b)
  std::vector<expr_ptr> items;
  bool tuple = false;
  value eval(evaluator& ev) const override;
};
struct dict_expr : expr {
  std::vector<std::pair<expr_ptr, expr_ptr>> items;
  value eval(evaluator& ev) const override;
};
struct attr_expr : expr {  // obj.name
  expr_ptr obj;
  std::string name;
  value eval(evaluator& ev) const override;
};
struct index_expr : expr {  // obj[key]
  expr_ptr obj, key;
  value eval(evaluator& ev) const override;
};
struct slice_expr : expr {  // obj[start:stop:step], each part optional
  expr_ptr obj, start, stop, step;
  value eval(evaluator& ev) const override;
};
struct call_expr : expr {
  expr_ptr callee;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  value eval(evaluator& ev) const override;
};
struct filter_expr : expr {  // operand | name(args)
  expr_ptr operand;
  std::string name;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  value eval(evaluator& ev) const override;
};
struct test_expr : expr {  // operand is [not] name(args)
  expr_ptr operand;
  std::string name;
  std::vector<expr_ptr> args;
  bool negated = false;
  value eval(evaluator& ev) const override;
};
enum class unary_op { neg, pos, not_ };
struct unary_expr : expr {
  unary_op op;
  expr_ptr operand;
  value eval(evaluator& ev) const override;
};
enum class binary_op { add, sub, mul, div, floordiv, mod, pow, concat, and_, or_ };
struct binary_expr : expr {
  binary_op op;
  expr_ptr left, right;
  value eval(evaluator& ev) const override;
};
enum class compare_op { eq, ne, lt, le, gt, ge, in, not_in };
struct compare_expr : expr {  // a < b <= c: Python's chained comparison
  expr_ptr first;
  std::vector<std::pair<compare_op, expr_ptr>> rest;
  value eval(evaluator& ev) const override;
};
struct cond_expr : expr {  // then if cond else otherwise (otherwise may be absent: undefined)
  expr_ptr then, cond, otherwise;
  value eval(evaluator& ev) const override;
};

// Assignment targets of for and set: a name, or a (possibly nested) tuple of names.
struct target {
  std::string name;  // empty for a tuple
  std::vector<target> elements;  // tuple elements
};

// Statement nodes.
struct text_stmt : stmt {
  std::string text;
  void exec(evaluator& ev) const override;
};
struct output_stmt : stmt {  // {{ expr }}
  expr_ptr value_;
  void exec(evaluator& ev) const override;
};
struct if_stmt : stmt {
  std::vector<std::pair<expr_ptr, body>> branches;  // if and elifs
  body otherwise;
  void exec(evaluator& ev) const override;
};
struct for_stmt : stmt {
  target var;
  expr_ptr iterable;
  expr_ptr filter;  // for x in xs if cond
  body body_, otherwise;
  void exec(evaluator& ev) const override;
};
struct set_stmt : stmt {  // {% set a = e %}, {% set a, b = e %}, {% set ns.attr = e %}
  target var;
  std::string ns_attr;  // non-empty: var.name is the namespace, this its attribute
  expr_ptr value_;
  void exec(evaluator& ev) const override;
};
struct filter_call {  // a filter applied to a block: {% set x | f %}, {% filter f %}
  std::string name;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
  source_pos pos;
};
struct set_block_stmt : stmt {  // {% set x %}...{% endset %}
  std::string name;
  std::vector<filter_call> filters;
  body body_;
  void exec(evaluator& ev) const override;
};
struct macro_param {
  std::string name;
  expr_ptr default_;  // may be null
};
struct macro_stmt : stmt {
  std::string name;
  std::vector<macro_param> params;
  body body_;
  void exec(evaluator& ev) const override;
};
struct call_block_stmt : stmt {  // {% call m(args) %}body{% endcall %}: body is m's caller()
  std::unique_ptr<call_expr> call;
  std::vector<macro_param> caller_params;
  body body_;
  void exec(evaluator& ev) const override;
};
struct filter_block_stmt : stmt {
  std::vector<filter_call> filters;
  body body_;
  void exec(evaluator& ev) const override;
};
struct block_stmt : stmt {  // {% generation %}: rendered as is (transformers uses it for masks)
  body body_;
  void exec(evaluator& ev) const override;
};
enum class loop_control { break_, continue_ };
struct loop_control_stmt : stmt {
  loop_control kind;
  void exec(evaluator& ev) const override;
};

struct program_ast {
  body root;
};

// Parses a whole template (jinja_parse.cpp).
std::shared_ptr<program_ast> parse_template(std::string_view source);

// ---- evaluator ----------------------------------------------------------------------------------

// A scope: variables set by {% set %} and for-loop variables. Lookups walk to the parent. Each
// for-loop iteration gets a fresh frame, so assignments in a loop body do not outlive the
// iteration (Jinja2's scoping, the reason templates use namespace()).
struct frame {
  std::vector<std::pair<std::string, value>> vars;
  std::shared_ptr<frame> parent;
  const value* find(std::string_view name) const;
  void set(const std::string& name, value v);
};

// Thrown through the evaluator by {% break %} / {% continue %}; caught by the innermost loop.
struct loop_signal {
  loop_control kind;
};

class evaluator {
 public:
  evaluator(const render_options& options, std::shared_ptr<frame> globals);

  value lookup(const std::string& name, source_pos pos) const;
  void assign(const target& t, const value& v, source_pos pos);
  void emit(std::string_view text);
  void exec_body(const body& b);
  void step(source_pos pos);  // one unit of work; fails past options.max_steps

  // Runs `fn` with a fresh scope whose parent is `parent` (or the current scope), restoring after.
  template <class F>
  void with_scope(std::shared_ptr<frame> parent, F&& fn);
  // Renders `b` into a string instead of the output (macros, set blocks, filter blocks).
  std::string capture(const std::function<void()>& fn);

  value call(const value& callee, call_args& args, source_pos pos);
  value apply_filter(const std::string& name, const value& input, call_args& args);
  bool apply_test(const std::string& name, const value& input, call_args& args);
  value get_attr(const value& obj, const std::string& name, source_pos pos);
  value get_item(const value& obj, const value& key, source_pos pos);

  // Depth guard for recursion: nested macro calls and blocks.
  struct depth_guard {
    evaluator& ev;
    depth_guard(evaluator& e, source_pos pos);
    ~depth_guard() { --ev.depth_; }
  };

  const render_options& options() const { return options_; }
  std::shared_ptr<frame> scope() const { return scope_; }
  std::shared_ptr<frame> globals() const { return globals_; }
  std::string& out() { return *out_; }

 private:
  const render_options& options_;
  std::shared_ptr<frame> globals_, scope_;
  std::string root_out_;
  std::string* out_ = &root_out_;
  uint64_t steps_ = 0;
  int depth_ = 0;
  friend std::string render_program(const program_ast&, value, const render_options&);
};

template <class F>
void evaluator::with_scope(std::shared_ptr<frame> parent, F&& fn) {
  auto f = std::make_shared<frame>();
  f->parent = parent ? std::move(parent) : scope_;
  auto saved = scope_;
  scope_ = std::move(f);
  try {
    fn();
  } catch (...) {
    scope_ = std::move(saved);
    throw;
  }
  scope_ = std::move(saved);
}

// Builtins (jinja_builtins.cpp).
const value* find_global(const std::string& name);  // range, namespace, dict, raise_exception, ...
value call_filter(evaluator& ev, const std::string& name, const value& input, call_args& args);
// What a for loop or a filter walks: a list's items, a dict's keys, a string's characters
// (undefined: nothing); anything else fails "not iterable" at pos.
std::vector<value> items_of(const value& v, source_pos pos = {});
bool call_test(evaluator& ev, const std::string& name, const value& input, call_args& args);
// A bound method (str.strip, dict.items, ...) or undefined when `obj` has no method `name`.
value find_method(const value& obj, const std::string& name);

// Argument helpers for builtins: the i-th positional argument or the keyword `name`, else `def`.
const value* arg(const call_args& a, size_t i, std::string_view name);
value arg_or(const call_args& a, size_t i, std::string_view name, value def);

std::string render_program(const program_ast& prog, value context, const render_options& options);

}  // namespace tandem::jinja::detail
