// json.h — the two JSON helpers the daemon and the CLI share: escaping a
// string into a literal (status, reports) and reading one field of the
// flat JSON a daemon returns. No parser: every JSON here is written by
// lockstep itself.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// A field of the flat status JSON a daemon returns ("role", "commit_index"...),
// string values unescaped.
std::string JsonField(const std::string& json, const std::string& key);
// A field's value as a whole number; `absent` when the field is missing or
// is not one (text from another process is never trusted to be well formed:
// std::stoull on a peer's status threw in a thread with no catch).
uint64_t JsonU64(const std::string& json, const std::string& key, uint64_t absent = 0);
int64_t JsonI64(const std::string& json, const std::string& key, int64_t absent = 0);
// s as the inside of a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace lockstep
