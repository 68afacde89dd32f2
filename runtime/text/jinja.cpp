// Public face of the Jinja interpreter (runtime/text/jinja.h): turns the interpreter's internal errors
// into tandem::failure with the template position in front.
#include "runtime/text/jinja.h"

#include "runtime/text/jinja_internal.h"

namespace tandem::jinja {

namespace {

[[noreturn]] void rethrow(const detail::template_error& e) {
  if (e.raised) throw failure(errc::invalid_argument, std::string(raised_prefix) + e.message);
  if (e.pos.line > 0)
    throw failure(errc::invalid_argument, "template line " + std::to_string(e.pos.line) + " col " +
                                              std::to_string(e.pos.col) + ": " + e.message);
  throw failure(errc::invalid_argument, "template: " + e.message);
}

template <class Json>
std::string render_json(const detail::program_ast* ast, const Json& context, const render_options& options) {
  if (!ast) throw failure(errc::invalid_argument, "template: render() on a template that was never parsed");
  if (!context.is_object() && !context.is_null())
    throw failure(errc::invalid_argument, "template: the context must be a JSON object");
  try {
    return detail::render_program(*ast, detail::from_json(context), options);
  } catch (const detail::template_error& e) {
    rethrow(e);
  }
}

}  // namespace

template_ template_::parse(std::string_view source) {
  template_ t;
  try {
    t.ast_ = detail::parse_template(source);
  } catch (const detail::template_error& e) {
    rethrow(e);
  }
  return t;
}

std::string template_::render(const nlohmann::ordered_json& context, const render_options& options) const {
  return render_json(ast_.get(), context, options);
}

std::string template_::render(const nlohmann::json& context, const render_options& options) const {
  return render_json(ast_.get(), context, options);
}

}  // namespace tandem::jinja
