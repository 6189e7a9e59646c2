// A small JSON Schema validator for the subset grammar/json_schema.h supports, written
// independently of the grammar (test-only): the sampling test checks generated JSON with it.
// Returns "" when `value` validates, else why not (with the JSON pointer of the failure).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace pdserve::grammar::testing {

std::string ValidateJson(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema);

// Whether some object in the JSON text repeats a key (parsing keeps only the last one).
bool HasDuplicateKeys(const std::string& json_text);

}  // namespace pdserve::grammar::testing
