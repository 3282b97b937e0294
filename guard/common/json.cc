// json.cc — JSON string escaping and flat field lookup (json.h).
#include "guard/common/json.h"

#include <charconv>
#include <cstdio>

namespace lockstep {

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

std::string JsonField(const std::string& json, const std::string& key) {
  std::string pat = "\"" + key + "\":";
  size_t p = json.find(pat);
  if (p == std::string::npos) return "";
  p += pat.size();
  if (p < json.size() && json[p] == '"') {
    std::string v;
    for (size_t i = p + 1; i < json.size() && json[i] != '"'; i++) {
      if (json[i] == '\\' && i + 1 < json.size()) {
        i++;
        if (json[i] == 'u' && i + 4 < json.size()) {
          v += static_cast<char>(std::stoi(json.substr(i + 1, 4), nullptr, 16));
          i += 4;
          continue;
        }
      }
      v += json[i];
    }
    return v;
  }
  size_t e = json.find_first_of(",}]", p);
  return json.substr(p, e - p);
}

template <typename T>
static T JsonNumber(const std::string& json, const std::string& key, T absent) {
  std::string text = JsonField(json, key);
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  return text.empty() || ec != std::errc() || end != text.data() + text.size() ? absent : v;
}

uint64_t JsonU64(const std::string& json, const std::string& key, uint64_t absent) {
  return JsonNumber<uint64_t>(json, key, absent);
}

int64_t JsonI64(const std::string& json, const std::string& key, int64_t absent) {
  return JsonNumber<int64_t>(json, key, absent);
}

}  // namespace lockstep
