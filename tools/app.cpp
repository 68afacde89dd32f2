// What every tandem binary does around its subcommands: the allocator settings, the logger,
// the global flags (--log-level, --log-format, --config, --version), naming an unknown command,
// and the exit codes. `tandem` (main.cpp) and `tandem-bench` (bench_main.cpp) differ only in
// the subcommands they add.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <tandem/version.h>

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "runtime/errors.h"
#include "runtime/oplog.h"
#include "tools/commands.h"

namespace tandem::cli {

std::filesystem::path sibling_binary(std::string_view name) {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / std::string(name);
}

void add_external(CLI::App& app, std::string_view name, std::string_view description, std::string_view binary,
                  char** argv) {
  auto* cmd = app.add_subcommand(std::string(name), std::string(description) + " (in " + std::string(binary) + ")");
  // Everything after the name is the other binary's to parse, --help included.
  cmd->prefix_command();
  cmd->set_help_flag();
  cmd->callback([name = std::string(name), binary = std::string(binary), argv] {
    const auto path = sibling_binary(binary);
    if (!std::filesystem::exists(path))
      throw failure(errc::unsupported, "tandem " + name + " is in " + binary +
                                           ", which is not built beside this binary (" + path.string() +
                                           "); build it with: cmake --build build --target " + binary);
    // The same argv (global flags, --config, the subcommand and its flags): the other binary
    // parses it exactly as this one would have.
    ::execv(path.c_str(), argv);
    throw failure(errc::internal, "tandem " + name + ": cannot run " + path.string() + ": " + std::strerror(errno));
  });
}

int run_app(int argc, char** argv, const std::function<void(CLI::App&)>& add_commands) {
  // KV blocks are hundreds of KiB: by default glibc gives each its own mmap and unmaps it on
  // free, so every export and every landing buffer page-faults afresh. Measured on the dev VM:
  // allocating + copying 21 MB of KV took 73 ms that way, 1 ms into reused memory. Keep such
  // chunks in the heap for reuse (freed memory above 256 MiB is still returned to the OS).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // ... and in one arena: a thread's own arena grows in 64 MiB heaps that glibc unmaps whole
  // once free (whatever M_TRIM_THRESHOLD says), so a KV receiver's landing buffers faulted in
  // again every frame. `tandem bench transport --blocks 256` on the dev VM: shared memory
  // 30% -> 52% of memcpy, TCP 24% -> 45%. Allocation is rare on the hot paths (the engines
  // preallocate), so one arena's lock costs nothing measurable there.
  mallopt(M_ARENA_MAX, 1);
  // stdout carries only results (generated text, JSON); logs go to stderr.
  auto log = spdlog::stderr_color_mt("tandem");
  spdlog::set_default_logger(log);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  CLI::App app{"tandem: disaggregated LLM serving on actors", "tandem"};
  app.require_subcommand(1);
  // --help shows every option's default; a --config file's unknown key is an error naming it,
  // as the same flag on the command line is (both inherited by every subcommand).
  app.option_defaults()->always_capture_default();
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_version_flag("--version", "tandem " TANDEM_VERSION);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
  // Flags from a TOML/INI file: a [serve] section holds `tandem serve`'s (names without --).
  app.set_config("--config", "", "Read flags from a TOML/INI file ([serve] section: port = 8080, ...)")
      ->check(CLI::ExistingFile);
  std::string log_format = "text";
  app.add_option("--log-format", log_format,
                 "Logs as text lines or one JSON object per line (for Loki, Elasticsearch, jq)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.parse_complete_callback([&] {
    spdlog::set_level(spdlog::level::from_str(log_level));
    oplog::set_format(log_format == "json" ? oplog::format::json : oplog::format::text);
  });
  add_commands(app);
  // CLI11 reports an unknown first word only as "a subcommand is required": name it instead.
  std::string names;
  bool known = false;
  for (const auto* sc : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sc->get_name();
    known = known || (argc > 1 && sc->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "tandem: unknown command '" << argv[1] << "' (commands: " << names << "; see tandem --help)\n";
    return 109;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const failure& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tandem::cli
