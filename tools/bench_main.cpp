// tandem-bench: `tandem bench ...` and `tandem chaos ...`, which the tandem binary runs from here
// (tools/commands.h says why they are apart). It takes the same command line as tandem.
#include "tools/commands.h"

int main(int argc, char** argv) {
  using namespace tandem::cli;
  return run_app(argc, argv, [](CLI::App& app) {
    add_bench(app);
    add_chaos(app);
  });
}
