// tandem: one binary, one subcommand per job; the benchmarks and the chaos soak are in
// tandem-bench beside it (bench_main.cpp), run through `tandem bench` and `tandem chaos`.
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace tandem::cli;
  return run_app(argc, argv, [argv](CLI::App& app) {
    add_generate(app);
    add_model(app);
    add_external(app, "bench", bench_description, bench_binary, argv);
    add_serve(app);
    add_external(app, "chaos", chaos_description, bench_binary, argv);
  });
}
