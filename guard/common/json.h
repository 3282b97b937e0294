// json.h — the two JSON helpers the daemon and the CLI share: escaping a
// string into a literal (status, reports) and reading one field of the
// flat JSON a daemon returns. No parser: every JSON here is written by
// lockstep itself.
#pragma once

#include <string>

namespace lockstep {

// A field of the flat status JSON a daemon returns ("role", "commit_index"...),
// string values unescaped.
std::string JsonField(const std::string& json, const std::string& key);
// s as the inside of a JSON string literal.
std::string JsonEscape(const std::string& s);

}  // namespace lockstep
