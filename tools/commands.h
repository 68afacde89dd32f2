#pragma once
// The subcommands of the `tandem` binary. Each registers its flags on the CLI11 app and
// returns the process exit code when run.
#include <filesystem>
#include <functional>
#include <string_view>

#include "kernels/cpu/matmul.h"

// CLI11 is declared, not included: it costs each file that parses it seconds to compile, and
// main.cpp and bench_main.cpp only hand an App around (the cmd_*.cpp files include it).
namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tandem::cli {

// Two binaries, one command line: `tandem` holds what serving needs (serve, generate, model) and
// `tandem-bench` beside it the benchmarks and the chaos soak, which `tandem bench ...` and
// `tandem chaos ...` run (as git runs git-NAME), so the first build, the one that starts
// `tandem serve`, compiles a quarter less. run_app: the global flags, logging and exit codes
// around `add_commands`'s subcommands (tools/app.cpp).
int run_app(int argc, char** argv, const std::function<void(CLI::App&)>& add_commands);
// A subcommand of `binary` beside this one: `tandem NAME ...` executes it with the same argv.
void add_external(CLI::App& app, std::string_view name, std::string_view description, std::string_view binary,
                  char** argv);
// `name` in this executable's directory (where the build and an install put both binaries).
std::filesystem::path sibling_binary(std::string_view name);
inline constexpr std::string_view bench_binary = "tandem-bench";
inline constexpr std::string_view bench_description = "Benchmarks that print figures";
inline constexpr std::string_view chaos_description =
    "Soak a running server while killing its actors; report what was lost (nothing, if it works)";

void add_generate(CLI::App& app);
void add_model(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_chaos(CLI::App& app);
void add_bench_serve(CLI::App* bench);  // `tandem bench serve` (cmd_bench_serve.cpp)
void add_bench_compare(CLI::App* bench);  // `tandem bench compare` (cmd_bench_serve.cpp)
void add_bench_transport(CLI::App* bench);  // `tandem bench transport` (cmd_bench_transport.cpp)
void add_bench_grammar(CLI::App* bench);  // `tandem bench grammar` (cmd_bench_grammar.cpp)
void add_model_hub(CLI::App* model);  // `tandem model pull|list|rm` (cmd_model_pull.cpp)

// Resolves --model: a path; synth:PRESET[:DTYPE], a synthetic model made once in the cache
// directory; hf:REPO[:QUANT], a Hugging Face GGUF (cached, else pulled); "stories260K" or
// nothing, the built-in default written to the cache directory on first use.
std::string resolve_model_path(const std::string& flag);
// hf:REPO[:QUANT] without its prefix: the cached file, else pulled from the hub (tools/hub).
std::string resolve_hf_model(const std::string& ref);

// --matmul batch-invariant|fastest on `cmd` (kernels/cpu/matmul.h says what each costs).
CLI::Option* add_matmul_option(CLI::App* cmd, std::string& value);
kernels::cpu::matmul_mode parse_matmul_mode(const std::string& value);
CLI::Option* add_kv_dtype_option(CLI::App* cmd, std::string& value);
kernels::dtype parse_kv_dtype(const std::string& value);

}  // namespace tandem::cli
