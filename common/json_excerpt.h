// JsonExcerpt: a short, safe rendering of an untrusted JSON value for error messages.
//
// nlohmann::json::dump() recurses once per nesting level, so dumping a value parsed from
// untrusted input ("[[[[...]]]]" 100k deep fits in a 200 KB request body or file header)
// overflows the stack, and a huge value makes a huge message. JsonExcerpt renders scalars
// (strings cut to `max_chars`) and only the first levels of arrays/objects, never recursing more
// than a few levels, and bounds the result to about `max_chars`.
//
// Thread-safety: pure function.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace pdserve {

std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars = 120);

}  // namespace pdserve
