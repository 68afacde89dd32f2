#pragma once
// Stop strings over streamed text. Text that could still be the start of a stop string is
// held back, so a client never sees part of a stop string; when one completes, the text
// before it is released and generation should end ("stop").
#include <string>
#include <vector>

namespace tandem {

class stop_matcher {
 public:
  explicit stop_matcher(std::vector<std::string> stops);

  // Appends generated text; returns what may be shown now.
  std::string push(const std::string& text);
  bool stopped() const { return stopped_; }
  // At the end of generation (not stopped): what was held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem
