// Pieces: the pre-tokenizer's working set, a list of views into text owned elsewhere.
// Most pieces point into the caller's input; a PieceArena owns the few strings a stage has to
// synthesise (a prefix space, a normalizer's output) so the views stay valid for one Encode.
//
// Thread-safety: per-call scratch; not shared between threads.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::tokenizer {

using Pieces = std::vector<std::string_view>;

class PieceArena {
 public:
  // Keeps `s` alive until the arena dies and returns a view of it (deque elements never move).
  std::string_view Store(std::string s) {
    strings_.push_back(std::move(s));
    return strings_.back();
  }

 private:
  std::deque<std::string> strings_;
};

}  // namespace pdserve::tokenizer
