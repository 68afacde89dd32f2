#pragma once
// The subcommands of the `tandem` binary. Each registers its flags on the CLI11 app and
// returns the process exit code when run.
#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_generate(CLI::App& app);
void add_model(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_chaos(CLI::App& app);

// Resolves --model: the given path, or the built-in default synthetic model (made on first use).
std::string resolve_model_path(const std::string& flag);

}  // namespace tandem::cli
