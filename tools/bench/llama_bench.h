#pragma once
// The reference llama.cpp's llama-bench, run as a subprocess on a GGUF file: the rival that
// `tandem bench kernels --against-llama-bench` measures tandem beside, round by round.
#include <string>

namespace tandem::bench {

class llama_bench {
 public:
  // dir holds llama-bench and the libraries it loads from beside itself. They are staged into
  // a private temporary folder first: a copy of the build whose library symlinks were
  // flattened into text files naming their targets (as in a read-only shared folder) loads
  // there too. Throws tandem::failure (io_error) when dir has no working llama-bench.
  explicit llama_bench(const std::string& dir);
  ~llama_bench();
  llama_bench(const llama_bench&) = delete;
  llama_bench& operator=(const llama_bench&) = delete;

  // Tokens/s of one run (-r 1): a prefill of `tokens` after `depth` tokens already in the
  // context, and a decode of `tokens` after `depth` (llama-bench's pp and tg tests at -d depth).
  double prefill_tps(const std::string& model, int threads, int tokens, int depth) const;
  double decode_tps(const std::string& model, int threads, int tokens, int depth) const;

 private:
  double run(const std::string& model, int threads, int prompt, int gen, int depth) const;
  std::string stage_;  // the staged folder
};

}  // namespace tandem::bench
