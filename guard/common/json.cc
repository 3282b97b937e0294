// json.cc — the JSON helpers over nlohmann-json (json.h).
#include "guard/common/json.h"

#include <limits>
#include <stdexcept>

namespace lockstep {

std::string JsonText(const Json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
}

bool ParseJson(std::string_view text, Json* out, std::string* error) {
  // nlohmann parses any depth without recursing, but copying, comparing and
  // dump() recurse: 60000 nested arrays in a report file overflowed the
  // stack in dump() (fuzz_json). What lockstep writes is 3 levels deep.
  auto limit = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth)
      throw std::length_error("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    *out = Json::parse(text, limit);
    return true;
  } catch (const std::exception& e) {
    // A parse error's what() names the byte and what was expected there.
    if (error) *error = e.what();
    *out = Json();
    return false;
  }
}

const Json& JsonAt(const Json& j, const char* key) {
  static const Json null_value;
  if (!j.is_object()) return null_value;
  auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}

uint64_t JsonU64(const Json& j, const char* key, uint64_t absent) {
  const Json& v = JsonAt(j, key);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return absent;
}

int64_t JsonI64(const Json& j, const char* key, int64_t absent) {
  const Json& v = JsonAt(j, key);
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    return u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(u)
                                                                           : absent;
  }
  return v.is_number_integer() ? v.get<int64_t>() : absent;
}

double JsonDouble(const Json& j, const char* key, double absent) {
  const Json& v = JsonAt(j, key);
  return v.is_number() ? v.get<double>() : absent;
}

bool JsonBool(const Json& j, const char* key, bool absent) {
  const Json& v = JsonAt(j, key);
  return v.is_boolean() ? v.get<bool>() : absent;
}

std::string JsonStr(const Json& j, const char* key, const std::string& absent) {
  const Json& v = JsonAt(j, key);
  return v.is_string() ? v.get<std::string>() : absent;
}

std::string JsonFromBytes(std::string_view bytes) {
  std::string o;
  o.reserve(bytes.size() + bytes.size() / 4);
  for (unsigned char c : bytes) {
    if (c < 0x80) {
      o += static_cast<char>(c);
    } else {  // U+0080..U+00FF in UTF-8: two bytes
      o += static_cast<char>(0xc0 | (c >> 6));
      o += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return o;
}

std::string BytesFromJson(const std::string& utf8) {
  std::string o;
  o.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size(); i++) {
    unsigned char c = static_cast<unsigned char>(utf8[i]);
    if (c < 0x80) {
      o += static_cast<char>(c);
    } else if ((c == 0xc2 || c == 0xc3) && i + 1 < utf8.size() &&
               (static_cast<unsigned char>(utf8[i + 1]) & 0xc0) == 0x80) {
      o += static_cast<char>(((c & 0x1f) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3f));
      i++;
    } else {
      o += '?';  // a code point above U+00FF: skip its continuation bytes
      while (i + 1 < utf8.size() && (static_cast<unsigned char>(utf8[i + 1]) & 0xc0) == 0x80) i++;
    }
  }
  return o;
}

}  // namespace lockstep
