// config.cc — cluster.toml and the TOML reading the apps/ profiles share:
// toml++ parses, and the typed getters here refuse what lockstep does not
// take (unknown fields, wrong types, values out of range), naming line and
// column.
#include "guard/common/config.h"

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "consensus/core.h"
#include "guard/common/command_line.h"
#include "preload/mc_scan.h"
#include "preload/resp_scan.h"

namespace lockstep {

namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

TomlPos PosOf(const toml::source_region& r) {
  return {static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)};
}

// The text of line `line` (1-based) of text, without its newline.
std::string LineText(const std::string& text, int line) {
  size_t b = 0;
  for (int i = 1; i < line && b != std::string::npos; i++) {
    b = text.find('\n', b);
    if (b != std::string::npos) b++;
  }
  if (b == std::string::npos || b > text.size()) return "";
  size_t e = text.find('\n', b);
  return text.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// The character at `at` (columns count code points, as toml++'s do).
char CharAt(const std::string& text, TomlPos at) {
  std::string line = LineText(text, at.line);
  size_t i = 0;
  for (int col = 1; col < at.column && i < line.size(); col++) {
    i++;
    while (i < line.size() && (static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) i++;
  }
  return i < line.size() ? line[i] : '\0';
}

// What a table under a [section.sub] header is, to Describe and NoLeftovers.
const char kSubsection[] = "a [section] of its own";

// At most `max` characters of s, for quoting it in an error.
std::string Clip(const std::string& s, size_t max = 40) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

// What a node holds, for errors ("an integer (7)"). text tells a table from
// a [header] apart from one made by a dotted key.
std::string Describe(const toml::node& n, const std::string& text) {
  switch (n.type()) {
    case toml::node_type::string: return "a string (" + Clip(TomlQuote(n.as_string()->get())) + ")";
    case toml::node_type::integer:
      return "an integer (" + std::to_string(n.as_integer()->get()) + ")";
    case toml::node_type::boolean: return n.as_boolean()->get() ? "true" : "false";
    case toml::node_type::floating_point: {
      char buf[64];
      snprintf(buf, sizeof buf, "%g", n.as_floating_point()->get());
      return std::string("a float (") + buf + ")";
    }
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time of day";
    case toml::node_type::date_time: return "a date and time";
    case toml::node_type::table:
      if (n.as_table()->is_inline()) return "an inline table { ... }";
      return CharAt(text, PosOf(n.source())) == '[' ? kSubsection : "a dotted key's table";
    case toml::node_type::array: {
      const toml::array& a = *n.as_array();
      if (a.empty()) return "an empty array";
      return a.is_homogeneous() ? "an array of " + Describe(a[0], text) + " and the like"
                                : "an array of mixed values";
    }
    default: return "an unknown kind of value";
  }
}

// toml++ 3.3 (Debian 12's) reaches __builtin_unreachable() when it asks
// whether one of these non-ASCII code points is whitespace (its generated
// is_non_ascii_horizontal_whitespace has no case for them; upstream issues
// 190 and 295): undefined behaviour on a file with, say, "x = 1º". The
// test mirrors that function's table.
bool TomlppCannotClassify(char32_t c) {
  if (c <= 0xA0 || c >= 0xFEFF || c == 0x3000) return false;
  uint64_t block = (c - 0xA0) / 0x3FA;
  if ((uint64_t{1} << block) & 0x7FFFFFFFFFFFF75Eull) return false;
  return block != 5 && block != 7;
}

// The code point of the 2- or 3-byte UTF-8 sequence at s[i] and its length
// in *n, else 0 (ASCII, 4 bytes, or not UTF-8: toml++ judges those itself).
char32_t Utf8At(const std::string& s, size_t i, size_t* n) {
  auto cont = [&](size_t j) {
    return j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80;
  };
  unsigned char b = static_cast<unsigned char>(s[i]);
  *n = 1;
  if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
    *n = 2;
    return (char32_t{b & 0x1Fu} << 6) | (s[i + 1] & 0x3F);
  }
  if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
    *n = 3;
    return (char32_t{b & 0x0Fu} << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  return 0;
}

std::string Utf8(char32_t c) {  // c < 0x10000
  if (c < 0x800) return {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
  return {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
}

// The text toml++ may safely parse: every code point it cannot classify
// swapped for a private-use one (U+E000.., which it can; columns count
// code points, so line:column stay right), and what it returns swapped back.
class SafeForTomlpp {
 public:
  explicit SafeForTomlpp(const std::string& text) {
    // Private-use code points the file holds, or may name as \uXXXX, are no placeholders.
    std::set<char32_t> used;
    for (size_t i = 0, n = 1; i < text.size(); i += n) {
      used.insert(Utf8At(text, i, &n));
      if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == 'u' || text[i + 1] == 'U'))
        used.insert(static_cast<char32_t>(
            strtoul(text.substr(i + 2, text[i + 1] == 'u' ? 4 : 8).c_str(), nullptr, 16)));
    }
    char32_t next = 0xE000;
    for (size_t i = 0, n = 1; i < text.size(); i += n) {
      char32_t c = Utf8At(text, i, &n);
      if (!TomlppCannotClassify(c)) {
        text_.append(text, i, n);
        continue;
      }
      if (!to_.count(c)) {
        while (used.count(next)) next++;
        if (next > 0xF8FF) return;  // ok() is false: no placeholder left
        to_[c] = next;
        back_[next++] = c;
      }
      text_ += Utf8(to_[c]);
    }
    ok_ = true;
  }
  bool ok() const { return ok_; }
  const std::string& text() const { return text_; }
  std::string Restore(const std::string& s) const {
    if (back_.empty()) return s;
    std::string out;
    for (size_t i = 0, n = 1; i < s.size(); i += n) {
      auto it = back_.find(Utf8At(s, i, &n));
      if (it == back_.end())
        out.append(s, i, n);
      else
        out += Utf8(it->second);
    }
    return out;
  }

 private:
  bool ok_ = false;
  std::string text_;
  std::map<char32_t, char32_t> to_, back_;
};

TomlValue MakeValue(const toml::key& k, const toml::node& n, const std::string& text,
                    const SafeForTomlpp& safe) {
  TomlValue v;
  v.key = PosOf(k.source());
  v.pos = PosOf(n.source());
  v.what = safe.Restore(Describe(n, text));
  if (const auto* s = n.as_string()) {
    v.kind = TomlValue::kString;
    v.str = safe.Restore(s->get());
  } else if (const auto* i = n.as_integer()) {
    v.kind = TomlValue::kInt;
    v.num = i->get();
  } else if (const auto* b = n.as_boolean()) {
    v.kind = TomlValue::kBool;
    v.num = b->get();
  } else if (const auto* a = n.as_array(); a && (a->empty() || a->is_homogeneous<std::string>())) {
    v.kind = TomlValue::kStringList;
    for (const toml::node& e : *a) {
      v.list.push_back(safe.Restore(e.as_string()->get()));
      v.list_pos.push_back(PosOf(e.source()));
    }
  } else {
    v.kind = TomlValue::kOther;
  }
  return v;
}

// toml++'s message for a syntax error, with the field or section of the
// line it is on and a hint how to fix it.
std::string SyntaxError(const std::string& text, const std::string& path,
                        const toml::parse_error& e) {
  TomlPos at = PosOf(e.source());
  std::string what(e.description());
  std::string line = Trim(LineText(text, at.line));
  std::string context;
  size_t eq = line.find('=');
  if (!line.empty() && line[0] == '[') {
    size_t close = line.rfind(']');
    context = "section " + (close == std::string::npos ? line : line.substr(0, close + 1)) + ": ";
  } else if (eq != std::string::npos && eq > 0) {
    std::string key = Trim(line.substr(0, eq));
    bool plain = key.find_first_of(" \t\"'#") == std::string::npos;
    if (plain) context = "field '" + key + "': ";
  }
  auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  std::string hint;
  if (has("unknown escape sequence"))
    hint = "write \\\\ for a backslash in a \"string\", or use a 'literal string'";
  else if (has("existing table") || has("existing array") || has("as table"))
    hint = "a [section] may appear only once ([[section]] may repeat): merge the two";
  else if (has("cannot redefine"))
    hint = "a field may be set only once in its section: remove one";
  else if (has("end-of-file"))
    hint = "is a closing quote, \"\"\" or bracket missing?";
  else if (has("control characters"))
    hint =
        "a string in \" or ' ends on its line: is its closing quote missing? (\"\"\"...\"\"\" "
        "spans lines)";
  else if (has("utf-8"))
    hint = "the file must be UTF-8";
  else if (has("value type") || has("floating-point") || has("boolean") ||
           has("expected a comment or whitespace"))
    hint =
        "a string needs quotes (\"...\" or '...'), and after a value only a # comment may "
        "follow";
  else if (has("expected '='") || has("expected keys") || has("bare keys"))
    hint = "each line is field = value, a [section] header or a # comment";
  else if (has("not representable"))
    hint = "integers are 64 bits";
  else
    hint = "see https://toml.io/en/v1.0.0 for TOML's syntax";
  return TomlWhere(path, at) + context + what + " (" + hint + ")";
}

// Levenshtein distance, for "did you mean".
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

bool BadRelativePath(const std::string& item) {
  bool climbs = item == ".." || item.rfind("../", 0) == 0 ||
                item.find("/../") != std::string::npos ||
                (item.size() >= 3 && item.compare(item.size() - 3, 3, "/..") == 0);
  return item.empty() || item[0] == '/' || climbs;
}

}  // namespace

// ------------------------------------------------------------ TOML files

std::string TomlWhere(const std::string& path, TomlPos at) {
  return path + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": ";
}

bool TomlTable::Fail(TomlPos at, const std::string& msg, std::string* error) const {
  *error = TomlWhere(path, at) + msg;
  return false;
}

TomlPos TomlTable::At(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? pos : it->second.pos;
}

const TomlValue* TomlTable::Find(const std::string& key) {
  asked_.insert(key);
  auto it = fields.find(key);
  return it == fields.end() ? nullptr : &it->second;
}

bool TomlTable::Missing(const std::string& key, bool required, std::string* error) const {
  if (!required) return true;
  return Fail(pos, "field '" + key + "' missing in " + Name() + " (add " + key + " = ...)", error);
}

bool TomlTable::WrongType(const std::string& key, const TomlValue& v, const std::string& expected,
                          std::string* error) const {
  return Fail(v.pos, "field '" + key + "': expected " + expected + ", got " + v.what, error);
}

bool TomlTable::TakeString(const std::string& key, std::string* dst, bool required,
                           std::string* error) {
  const TomlValue* v = Find(key);
  if (!v) return Missing(key, required, error);
  if (v->kind != TomlValue::kString)
    return WrongType(key, *v, "a string in quotes (\"...\" or '...')", error);
  *dst = v->str;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeInt(const std::string& key, int64_t* dst, bool required, int64_t lo, int64_t hi,
                        std::string* error) {
  const TomlValue* v = Find(key);
  if (!v) return Missing(key, required, error);
  if (v->kind != TomlValue::kInt)
    return WrongType(key, *v, "an integer in " + std::to_string(lo) + ".." + std::to_string(hi),
                     error);
  if (v->num < lo || v->num > hi)
    return Fail(v->pos,
                "field '" + key + "': " + std::to_string(v->num) + " is out of range " +
                    std::to_string(lo) + ".." + std::to_string(hi),
                error);
  *dst = v->num;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeBool(const std::string& key, bool* dst, std::string* error) {
  const TomlValue* v = Find(key);
  if (!v) return true;
  if (v->kind != TomlValue::kBool) return WrongType(key, *v, "true or false", error);
  *dst = v->num != 0;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeUncheckedReplies(std::string* dst, std::string* error) {
  return TakeCommandList("unchecked_replies", true, dst, error);
}

bool TomlTable::TakeCommandList(const std::string& key, bool bounded, std::string* dst,
                                std::string* error) {
  const TomlValue* v = Find(key);
  if (!v) return true;
  const std::string expected =
      "commands, each one or two words of letters, digits, '_', '-' or '|' (" +
      (bounded ? "at most " + std::to_string(RESP_LIST) + " of them, " : std::string()) +
      "words under " + std::to_string(RESP_WORD) +
      " characters), as one string separated by commas (\"INFO, CLIENT LIST\") or an array "
      "([\"INFO\", \"CLIENT LIST\"])";
  std::string list;
  resp_list parsed;
  if (v->kind == TomlValue::kString) {
    list = v->str;
  } else if (v->kind == TomlValue::kStringList) {
    for (size_t i = 0; i < v->list.size(); i++) {
      // one command each: a comma inside would make it two
      if (resp_list_parse(&parsed, v->list[i].c_str()) != 0 || parsed.count != 1)
        return Fail(v->list_pos[i],
                    "field '" + key + "': " + TomlQuote(v->list[i]) +
                        " is not one command; expected " + expected,
                    error);
      list += (i ? ", " : "") + v->list[i];
    }
  } else {
    return WrongType(key, *v, expected, error);
  }
  // Unbounded: each entry on its own (resp_list holds RESP_LIST at most); an
  // empty list is refused (it would read as no list: everything passes).
  bool bad = false;
  if (bounded) {
    bad = resp_list_parse(&parsed, list.c_str()) != 0;
  } else {
    size_t start = 0;
    while (!bad && start <= list.size()) {
      size_t comma = list.find(',', start);
      if (comma == std::string::npos) comma = list.size();
      std::string one = list.substr(start, comma - start);
      bad = resp_list_parse(&parsed, one.c_str()) != 0 || parsed.count != 1;
      start = comma + 1;
    }
  }
  if (bad) return Fail(v->pos, "field '" + key + "': expected " + expected, error);
  *dst = list;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeLeaseReads(std::string* protocol, std::string* list, std::string* error) {
  std::string proto = "resp";
  if (!TakeString("lease_protocol", &proto, false, error)) return false;
  if (proto != "resp" && proto != "memcached")
    return Fail(At("lease_protocol"),
                "field 'lease_protocol': " + TomlQuote(proto) +
                    " is not a protocol lease reads know; expected \"resp\" (redis's) or "
                    "\"memcached\" (its text protocol)",
                error);
  if (Has("lease_protocol") && !Has("lease_reads"))
    return Fail(At("lease_protocol"),
                "field 'lease_protocol' names the protocol of lease_reads, but there is no "
                "lease_reads",
                error);
  if (proto == "resp") {
    if (!TakeCommandList("lease_reads", true, list, error)) return false;
    *protocol = list->empty() ? "" : proto;
    return true;
  }
  const TomlValue* v = Find("lease_reads");
  if (!v) return true;  // refused above: lease_protocol without lease_reads
  const std::string expected =
      "memcached's read-only commands the leader can answer under its lease: some of get, "
      "gets, mg (lower case), as one string (\"get, gets\") or an array ([\"get\", \"gets\"])";
  std::string joined;
  if (v->kind == TomlValue::kString) {
    joined = v->str;
  } else if (v->kind == TomlValue::kStringList) {
    for (size_t i = 0; i < v->list.size(); i++) joined += (i ? ", " : "") + v->list[i];
  } else {
    return WrongType("lease_reads", *v, expected, error);
  }
  mc_list parsed;
  if (mc_list_parse(&parsed, joined.c_str()) != 0 || parsed.cmds == 0)
    return Fail(v->pos,
                "field 'lease_reads': " + TomlQuote(joined) +
                    " with lease_protocol = \"memcached\"; expected " + expected,
                error);
  *list = joined;
  *protocol = proto;
  taken_.insert("lease_reads");
  return true;
}

bool TomlTable::TakeFileList(const std::string& key, std::vector<std::string>* dst,
                             std::string* error) {
  dst->clear();
  const TomlValue* v = Find(key);
  if (!v) return true;
  std::vector<std::pair<std::string, TomlPos>> items;
  if (v->kind == TomlValue::kString) {
    if (!Trim(v->str).empty()) {
      std::istringstream in(v->str);
      std::string item;
      while (std::getline(in, item, ',')) items.push_back({Trim(item), v->pos});
      if (v->str.back() == ',') items.push_back({"", v->pos});  // getline drops it
    }
  } else if (v->kind == TomlValue::kStringList) {
    for (size_t i = 0; i < v->list.size(); i++) items.push_back({v->list[i], v->list_pos[i]});
  } else {
    return WrongType(key, *v,
                     "relative file paths, as an array of strings ([\"a.conf\", \"sub/b.ndb\"]) or "
                     "one string separated by commas",
                     error);
  }
  for (const auto& [item, at] : items) {
    if (BadRelativePath(item)) {
      dst->clear();
      return Fail(at,
                  "field '" + key + "': '" + item +
                      "' is not a relative file path (none may be empty, absolute or climb out "
                      "with '..')",
                  error);
    }
    dst->push_back(item);
  }
  taken_.insert(key);
  return true;
}

bool TomlTable::NoLeftovers(std::string* error) const {
  const std::pair<const std::string, TomlValue>* first = nullptr;
  auto before = [](TomlPos a, TomlPos b) {
    return a.line < b.line || (a.line == b.line && a.column < b.column);
  };
  for (const auto& f : fields)
    if (!taken_.count(f.first) && (!first || before(f.second.key, first->second.key))) first = &f;
  if (!first) return true;
  const std::string& name = first->first;
  std::string hint;
  size_t best = 3;  // a closer known field is a likely typo of it
  for (const std::string& known : asked_) {
    size_t d = EditDistance(name, known);
    if (d < best) {
      best = d;
      hint = " (did you mean '" + known + "'?)";
    }
  }
  if (hint.empty() && !asked_.empty()) {
    hint = " (known fields: ";
    for (const std::string& known : asked_)
      hint += (&known == &*asked_.begin() ? "" : ", ") + known;
    hint += ")";
  }
  if (first->second.what == kSubsection) {  // [cluster.extra]: name it as it is written
    std::string outer = header.substr(header.find_first_not_of('['));
    outer = outer.substr(0, outer.find(']'));
    return Fail(first->second.pos, "unknown section [" + outer + "." + name + "]" + hint, error);
  }
  return Fail(first->second.key, "unknown field '" + name + "' in " + Name() + hint, error);
}

bool ParseToml(const std::string& text, const std::string& path,
               const std::vector<std::string>& headers, bool top_level,
               std::vector<TomlTable>* tables, std::string* error) {
  SafeForTomlpp safe(text);
  if (!safe.ok()) {
    *error = TomlWhere(path, {}) + "too many different non-ASCII characters for toml++ 3.3";
    return false;
  }
  toml::parse_result parsed = toml::parse(std::string_view(safe.text()), std::string_view(path));
  if (!parsed) {
    *error = safe.Restore(SyntaxError(text, path, parsed.error()));
    return false;
  }
  auto allowed = [&](const std::string& h) {
    return std::find(headers.begin(), headers.end(), h) != headers.end();
  };
  auto unknown_section = [&](const std::string& h, TomlPos at) {
    std::string expected;
    for (size_t i = 0; i < headers.size(); i++)
      expected += (i ? i + 1 == headers.size() ? " or " : ", " : "") + headers[i];
    *error = TomlWhere(path, at) + "unknown section " + h +
             (headers.empty() ? " (this file has no sections)" : " (expected " + expected + ")");
    return false;
  };
  auto section = [&](const std::string& h, const toml::table& t) {
    TomlTable s;
    s.path = path;
    s.header = h;
    s.pos = PosOf(t.source());
    for (auto&& [k, n] : t)
      s.fields[safe.Restore(std::string(k.str()))] = MakeValue(k, n, text, safe);
    return s;
  };
  std::vector<TomlTable> out;
  TomlTable top;
  top.path = path;
  for (auto&& [k, n] : parsed.table()) {
    std::string key = safe.Restore(std::string(k.str()));
    const toml::table* t = n.as_table();
    const toml::array* a = n.as_array();
    // [key], or key.field = ... where [key] is a section (TOML takes it for the same)
    if (t && !t->is_inline()) {
      std::string h = "[" + key + "]";
      bool header = CharAt(text, PosOf(n.source())) == '[';
      if (!allowed(h) && header) return unknown_section(h, PosOf(n.source()));
      if (allowed(h)) {
        out.push_back(section(h, *t));
        continue;
      }
    }
    // [[key]], once or more: an array of tables that are not inline
    if (a && a->is_array_of_tables() && !a->empty() && !(*a)[0].as_table()->is_inline()) {
      std::string h = "[[" + key + "]]";
      if (!allowed(h)) return unknown_section(h, PosOf(n.source()));
      for (const toml::node& e : *a) out.push_back(section(h, *e.as_table()));
      continue;
    }
    if (!top_level) {
      std::string expected;
      for (const auto& h : headers) expected += (expected.empty() ? "" : ", ") + h;
      *error = TomlWhere(path, PosOf(k.source())) + "field '" + key +
               "' outside any section (put it under one of " + expected + ")";
      return false;
    }
    top.fields[key] = MakeValue(k, n, text, safe);
  }
  if (!top.fields.empty()) out.push_back(top);
  // toml++ keeps keys sorted; callers want the file's order
  std::stable_sort(out.begin(), out.end(), [](const TomlTable& a, const TomlTable& b) {
    if (a.header.empty() != b.header.empty()) return a.header.empty();
    return a.pos.line < b.pos.line || (a.pos.line == b.pos.line && a.pos.column < b.pos.column);
  });
  *tables = std::move(out);
  return true;
}

bool ReadTextFile(const std::string& path, std::string* text, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = path + ": cannot open: " + strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  *text = ss.str();
  return true;
}

std::string TomlQuote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': q += "\\\""; break;
      case '\\': q += "\\\\"; break;
      case '\n': q += "\\n"; break;
      case '\t': q += "\\t"; break;
      case '\r': q += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {  // TOML allows no other control character in a string
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04X", u);
          q += buf;
        } else {
          q += c;
        }
    }
  }
  return q + "\"";
}

// ------------------------------------------------------------ cluster.toml

bool ParseClusterConfig(const std::string& text, const std::string& path, ClusterConfig* out,
                        std::string* error) {
  ClusterConfig c;
  c.path = path;
  std::vector<TomlTable> tables;
  if (!ParseToml(text, path, {"[cluster]", "[server]", "[checkpoint]", "[[replica]]"}, false,
                 &tables, error))
    return false;
  TomlTable* cluster = nullptr;
  TomlTable* server = nullptr;
  TomlTable* checkpoint = nullptr;
  std::vector<TomlTable*> replicas;
  for (auto& t : tables) {
    if (t.header == "[cluster]") cluster = &t;
    if (t.header == "[server]") server = &t;
    if (t.header == "[checkpoint]") checkpoint = &t;
    if (t.header == "[[replica]]") replicas.push_back(&t);
  }
  auto fail = [&](TomlPos at, const std::string& msg) {
    *error = TomlWhere(path, at) + msg;
    return false;
  };

  if (!cluster) return fail({}, "missing [cluster] section");
  TomlTable& t = *cluster;
  // A client's copy of cluster.toml may leave out what it must not hold.
  for (auto [name, value] : {std::pair<const char*, std::string*>{"secret", &c.secret},
                             {"client_secret", &c.client_secret},
                             {"admin_secret", &c.admin_secret}}) {
    if (!t.TakeString(name, value, false, error)) return false;
    if (t.Has(name) && value->size() < 16)
      return fail(t.At(name), std::string("field '") + name + "': must be at least 16 characters");
  }
  if (c.secret.empty() && c.client_secret.empty() && c.admin_secret.empty())
    return fail({},
                "[cluster] needs 'secret' (the replicas'), or at least 'client_secret' in a "
                "client's copy");
  if (!c.secret.empty()) {
    if (c.client_secret.empty()) c.client_secret = DerivedSecret(c.secret, "client");
    if (c.admin_secret.empty()) c.admin_secret = DerivedSecret(c.secret, "admin");
  }
  if (!t.TakeString("keys", &c.keys, false, error)) return false;
  if (t.Has("keys") && c.keys.empty())
    return fail(t.At("keys"), "field 'keys': empty (leave it out for \"keys\")");
  if (!t.TakeString("client_netns", &c.client_netns, false, error)) return false;
  if (!t.TakeBool("failpoints", &c.failpoints, error)) return false;
  if (!t.TakeString("leader_address", &c.leader_address, false, error) ||
      !t.TakeString("leader_interface", &c.leader_interface, false, error))
    return false;
  if (!c.leader_address.empty()) {
    size_t colon = c.leader_address.rfind(':');
    in_addr ignored{};
    int port = colon == std::string::npos ? 0 : atoi(c.leader_address.c_str() + colon + 1);
    if (colon == std::string::npos || port <= 0 || port > 65535 ||
        inet_pton(AF_INET, c.leader_address.substr(0, colon).c_str(), &ignored) != 1)
      return fail(t.At("leader_address"),
                  "field 'leader_address': '" + c.leader_address + "' is not IPV4:PORT");
    c.leader_host = c.leader_address.substr(0, colon);
    c.leader_port = port;
  }
  if (!t.TakeString("transport", &c.transport, false, error)) return false;
  if (c.transport != "shm" && c.transport != "tcp" && c.transport != "auto")
    return fail(t.At("transport"),
                "field 'transport': '" + c.transport + "' is not shm, tcp or auto");
  if (!t.TakeString("durability", &c.durability, false, error)) return false;
  if (c.durability != "disk" && c.durability != "memory")
    return fail(t.At("durability"),
                "field 'durability': '" + c.durability + "' is not disk or memory");
  int64_t n = 0;
  if (!t.TakeInt("ring_bytes", &n, false, 1 << 16, int64_t{1} << 34, error)) return false;
  if (n) c.ring_bytes = n;
  n = 0;
  if (!t.TakeInt("segment_bytes", &n, false, 1 << 16, int64_t{1} << 34, error)) return false;
  if (n) c.segment_bytes = n;
  n = 0;
  if (!t.TakeInt("heartbeat_us", &n, false, 100, 1000000, error)) return false;
  if (n) c.heartbeat_us = n;
  n = -1;
  if (!t.TakeInt("spin_us", &n, false, 0, 1000000, error)) return false;
  if (n >= 0) c.spin_us = n;
  n = 0;
  if (!t.TakeInt("election_timeout_min_us", &n, false, 1000, 60000000, error)) return false;
  if (n) c.election_timeout_min_us = n;
  n = 0;
  if (!t.TakeInt("election_timeout_max_us", &n, false, 1000, 60000000, error)) return false;
  if (n) c.election_timeout_max_us = n;
  if (c.election_timeout_max_us < c.election_timeout_min_us)
    return fail(t.At("election_timeout_max_us"),
                "field 'election_timeout_max_us' is below election_timeout_min_us");
  n = 0;
  if (!t.TakeInt("lease_us", &n, false, 0, 60000000, error)) return false;
  c.lease_us = n;
  n = 0;
  if (!t.TakeInt("voters", &n, false, 1, kMaxVoters, error)) return false;
  c.voters = static_cast<int>(n);
  if (c.lease_us) {
    CoreConfig core;
    core.lease_us = c.lease_us;
    if (core.LeaseGuardUs() > c.election_timeout_min_us)
      return fail(t.At("lease_us"),
                  "field 'lease_us': the backups' guard of a " + std::to_string(c.lease_us) +
                      " us lease (" + std::to_string(core.LeaseGuardUs()) +
                      " us: the lease, 1/16 of it and 500 us) must fit in "
                      "election_timeout_min_us (" +
                      std::to_string(c.election_timeout_min_us) + "): a lease of at most about " +
                      std::to_string((c.election_timeout_min_us - 500) * 16 / 17) + " us");
  }
  if (!t.NoLeftovers(error)) return false;

  if (server) {
    TomlTable& s = *server;
    if (!s.TakeString("command", &c.server.command, true, error)) return false;
    std::vector<std::string> argv;
    std::string why;
    if (!SplitCommand(c.server.command, &argv, &why))
      return fail(s.At("command"), "field 'command': " + why);
    if (argv.empty()) return fail(s.At("command"), "field 'command': is empty");
    if (!s.TakeString("app", &c.server.app, false, error)) return false;
    n = 0;
    if (!s.TakeInt("ready_timeout_ms", &n, false, 100, 3600000, error)) return false;
    if (n) c.server.ready_timeout_ms = n;
    if (!s.TakeString("ready_log", &c.server.ready_log, false, error)) return false;
    if (!s.TakeBool("same_random", &c.server.same_random, error)) return false;
    if (!s.TakeBool("same_clock", &c.server.same_clock, error)) return false;
    if (!s.TakeBool("timers_in_log", &c.server.timers_in_log, error)) return false;
    if (c.server.timers_in_log && !c.server.same_clock)
      return fail(s.At("timers_in_log"),
                  "field 'timers_in_log' needs same_clock = true (a tick moves the clock)");
    if (!s.TakeBool("cloned_start", &c.server.cloned_start, error)) return false;
    if (!s.TakeString("state_probe", &c.server.state_probe, false, error)) return false;
    n = 0;
    if (!s.TakeInt("state_check_every_s", &n, false, 1, 86400, error)) return false;
    if (n) c.server.state_check_every_s = n;
    if (s.Has("state_check_every_s") && c.server.state_probe.empty())
      return fail(s.At("state_check_every_s"),
                  "field 'state_check_every_s' needs a state_probe (the command it runs)");
    if (!s.TakeBool("serial_inputs", &c.server.serial_inputs, error)) return false;
    if (!s.TakeBool("serial_until_reply", &c.server.serial_until_reply, error)) return false;
    if (!s.TakeBool("serial_sleep_keeps_turn", &c.server.serial_sleep_keeps_turn, error))
      return false;
    for (const char* f : {"serial_until_reply", "serial_sleep_keeps_turn"})
      if (s.fields.count(f) && !c.server.serial_inputs)
        return fail(s.At(f), std::string("field '") + f + "' needs serial_inputs = true");
    if (!s.TakeBool("unchecked_greeting", &c.server.unchecked_greeting, error)) return false;
    if (!s.TakeString("data_template", &c.server.data_template, false, error)) return false;
    if (!s.TakeFileList("rendered_files", &c.server.rendered_files, error)) return false;
    if (!c.server.rendered_files.empty() && c.server.data_template.empty())
      return fail(s.At("rendered_files"),
                  "field 'rendered_files' names files of the data template, but there is no "
                  "data_template");
    if (!s.TakeUncheckedReplies(&c.server.unchecked_replies, error)) return false;
    if (!s.TakeCommandList("inspect_commands", false, &c.server.inspect_commands, error))
      return false;
    if (!s.TakeLeaseReads(&c.server.lease_protocol, &c.server.lease_reads, error)) return false;
    if (!s.NoLeftovers(error)) return false;
  }

  if (checkpoint) {
    TomlTable& k = *checkpoint;
    CheckpointPolicy& p = c.checkpoint;
    if (!k.TakeBool("enabled", &p.enabled, error)) return false;
    int64_t v = 0;
    if (!k.TakeInt("every_entries", &v, false, 1, int64_t{1} << 40, error)) return false;
    if (v) p.every_entries = v;
    v = 0;
    if (!k.TakeInt("every_seconds", &v, false, 1, 86400 * 365, error)) return false;
    if (v) p.every_seconds = v;
    v = 0;
    if (!k.TakeInt("every_log_bytes", &v, false, 1 << 16, int64_t{1} << 50, error)) return false;
    if (v) p.every_log_bytes = v;
    v = 0;
    if (!k.TakeInt("keep", &v, false, 1, 1000, error)) return false;
    if (v) p.keep = v;
    v = 0;
    if (!k.TakeInt("timeout_ms", &v, false, 100, 3600000, error)) return false;
    if (v) p.timeout_ms = v;
    v = 0;
    if (!k.TakeInt("lagging_backup_grace_seconds", &v, false, 1, 86400 * 365, error)) return false;
    if (v) p.lagging_backup_grace_s = v;
    if (!k.TakeBool("file_locks", &p.file_locks, error)) return false;
    if (!k.NoLeftovers(error)) return false;
    if (!c.has_server() && k.Has("enabled"))
      return fail(k.pos, "[checkpoint] without a [server] section (nothing to checkpoint)");
  }
  if (c.server.cloned_start && !c.checkpoint.enabled)
    return fail(server->At("cloned_start"),
                "field 'cloned_start' needs [checkpoint] enabled = true (the replicas' servers "
                "start from a checkpoint of replica 0's)");

  if (replicas.empty()) return fail({}, "no [[replica]] sections");
  if (replicas.size() > static_cast<size_t>(kMaxMemberIds))
    return fail(replicas[kMaxMemberIds]->pos, "at most " + std::to_string(kMaxMemberIds) +
                                                  " replicas (ids 0.." +
                                                  std::to_string(kMaxMemberIds - 1) + ")");
  if (c.voters == 0) {
    if (replicas.size() > static_cast<size_t>(kMaxVoters))
      return fail(replicas[kMaxVoters]->pos,
                  "more than " + std::to_string(kMaxVoters) +
                      " replicas: say in [cluster] how many of them (the first) the "
                      "configuration starts with (voters = 3, 5 or 7)");
    c.voters = static_cast<int>(replicas.size());
  } else if (c.voters > static_cast<int>(replicas.size())) {
    return fail({}, "[cluster] voters = " + std::to_string(c.voters) + " but only " +
                        std::to_string(replicas.size()) + " [[replica]] sections");
  }
  for (TomlTable* rt : replicas) {
    ReplicaConfig r;
    int64_t id = -1, peer_port = 0, client_port = 0, server_port = 0, metrics_port = 0;
    if (!rt->TakeInt("id", &id, true, 0, kMaxMemberIds - 1, error)) return false;
    if (id != static_cast<int64_t>(c.replicas.size()))
      return fail(rt->At("id"), "field 'id': replicas must be numbered 0.." +
                                    std::to_string(replicas.size() - 1) + " in order; expected " +
                                    std::to_string(c.replicas.size()) + ", got " +
                                    std::to_string(id));
    r.id = static_cast<int>(id);
    if (!rt->TakeString("host", &r.host, true, error)) return false;
    if (!rt->TakeInt("peer_port", &peer_port, true, 1, 65535, error)) return false;
    if (!rt->TakeInt("client_port", &client_port, true, 1, 65535, error)) return false;
    if (server) {
      if (!rt->TakeInt("server_port", &server_port, true, 1, 65535, error)) return false;
    } else if (rt->Has("server_port")) {
      return fail(rt->At("server_port"),
                  "field 'server_port' without a [server] section (no server to run)");
    }
    if (!rt->TakeString("dir", &r.dir, true, error)) return false;
    if (!rt->TakeString("netns", &r.netns, false, error)) return false;
    if (!rt->TakeInt("metrics_port", &metrics_port, false, 0, 65535, error)) return false;
    if (!rt->TakeBool("removed", &r.removed, error)) return false;
    if (!rt->NoLeftovers(error)) return false;
    r.peer_port = static_cast<int>(peer_port);
    r.client_port = static_cast<int>(client_port);
    r.server_port = static_cast<int>(server_port);
    r.metrics_port = static_cast<int>(metrics_port);
    c.replicas.push_back(r);
  }
  // A server port must not collide with any daemon port on the same host.
  for (size_t i = 0; i < c.replicas.size() && server; i++) {
    const ReplicaConfig& r = c.replicas[i];
    for (const ReplicaConfig& o : c.replicas) {
      if (o.host != r.host || o.netns != r.netns) continue;
      std::string clash = o.peer_port == r.server_port                       ? "peer_port"
                          : o.client_port == r.server_port                   ? "client_port"
                          : (o.id != r.id && o.server_port == r.server_port) ? "server_port"
                                                                             : "";
      if (!clash.empty())
        return fail(replicas[i]->At("server_port"),
                    "field 'server_port': " + std::to_string(r.server_port) + " is also replica " +
                        std::to_string(o.id) + "'s " + clash + " on " + r.host);
    }
  }
  // Nor a metrics port with any port on the same host.
  for (size_t i = 0; i < c.replicas.size(); i++) {
    const ReplicaConfig& r = c.replicas[i];
    if (!r.metrics_port) continue;
    for (const ReplicaConfig& o : c.replicas) {
      if (o.host != r.host || o.netns != r.netns) continue;
      std::string clash = o.peer_port == r.metrics_port                        ? "peer_port"
                          : o.client_port == r.metrics_port                    ? "client_port"
                          : o.server_port == r.metrics_port                    ? "server_port"
                          : (o.id != r.id && o.metrics_port == r.metrics_port) ? "metrics_port"
                                                                               : "";
      if (!clash.empty())
        return fail(replicas[i]->At("metrics_port"),
                    "field 'metrics_port': " + std::to_string(r.metrics_port) +
                        " is also replica " + std::to_string(o.id) + "'s " + clash + " on " +
                        r.host + " (choose another, or 0 for no metrics listener)");
    }
  }
  *out = c;
  return true;
}

bool LoadClusterConfig(const std::string& path, ClusterConfig* out, std::string* error) {
  std::string text;
  if (!ReadTextFile(path, &text, error)) return false;
  return ParseClusterConfig(text, path, out, error);
}

std::string FormatClusterConfig(const ClusterConfig& c) {
  std::ostringstream o;
  o << "# lockstep cluster configuration: the same file on every replica.\n"
    << "[cluster]\n"
    << "# the replicas' own secret, and those of clients and admins (a client's copy keeps\n"
    << "# only client_secret: see guard/common/config.h)\n";
  if (!c.secret.empty()) o << "secret = " << TomlQuote(c.secret) << "\n";
  if (!c.client_secret.empty()) o << "client_secret = " << TomlQuote(c.client_secret) << "\n";
  if (!c.admin_secret.empty()) o << "admin_secret = " << TomlQuote(c.admin_secret) << "\n";
  if (!c.keys.empty()) o << "keys = " << TomlQuote(c.keys) << "\n";
  o << "transport = " << TomlQuote(c.transport) << "\n"
    << "durability = " << TomlQuote(c.durability) << "\n"
    << "ring_bytes = " << c.ring_bytes << "\n"
    << "segment_bytes = " << c.segment_bytes << "\n"
    << "heartbeat_us = " << c.heartbeat_us << "\n"
    << "spin_us = " << c.spin_us << "\n"
    << "election_timeout_min_us = " << c.election_timeout_min_us << "\n"
    << "election_timeout_max_us = " << c.election_timeout_max_us << "\n";
  if (c.lease_us) o << "lease_us = " << c.lease_us << "\n";
  if (c.voters > 0 && c.voters != static_cast<int>(c.replicas.size()))
    o << "# the replicas the log's configuration starts with: ids 0.." << c.voters - 1
      << "\n# (who votes later is the log's: lockstep member list)\n"
      << "voters = " << c.voters << "\n";
  if (!c.client_netns.empty()) o << "client_netns = " << TomlQuote(c.client_netns) << "\n";
  if (c.failpoints) o << "failpoints = true\n";
  if (!c.leader_address.empty())
    o << "leader_address = " << TomlQuote(c.leader_address) << "\n"
      << "leader_interface = " << TomlQuote(c.leader_interface) << "\n";
  if (c.has_server()) {
    o << "\n# The server each daemon runs under the shim; {port} is the replica's server_port,\n"
      << "# {dir} its dir + \"/server\".\n"
      << "[server]\n"
      << "command = " << TomlQuote(c.server.command) << "\n";
    if (!c.server.app.empty()) o << "app = " << TomlQuote(c.server.app) << "\n";
    o << "ready_timeout_ms = " << c.server.ready_timeout_ms << "\n";
    if (!c.server.ready_log.empty())
      o << "# ready once it listens and its log says this\n"
        << "ready_log = " << TomlQuote(c.server.ready_log) << "\n";
    if (c.server.same_random)
      o << "# the server's randomness is the same on every replica (preload/shim_random.c)\n"
        << "same_random = true\n";
    if (c.server.same_clock)
      o << "# the server's wall clock is the leader's time of the input it processes\n"
        << "# (preload/shim_clock.c)\n"
        << "same_clock = true\n";
    if (c.server.timers_in_log)
      o << "# its timeouts are ticks in the log: timers fire at the same input everywhere\n"
        << "timers_in_log = true\n";
    if (c.server.cloned_start)
      o << "# every server starts from one image of replica 0's (checkpoint 0)\n"
        << "cloned_start = true\n";
    if (!c.server.state_probe.empty())
      o << "# the leader's state checks: this command's output digests the server's state\n"
        << "state_probe = " << TomlQuote(c.server.state_probe) << "\n"
        << "state_check_every_s = " << c.server.state_check_every_s << "\n";
    if (c.server.serial_inputs)
      o << "# one input executes at a time, whatever thread reads it (preload/shim_serial.c)\n"
        << "serial_inputs = true\n";
    if (c.server.serial_until_reply)
      o << "# ... until the server replied on its connection (preload/shim_serial.c)\n"
        << "serial_until_reply = true\n";
    if (c.server.serial_sleep_keeps_turn)
      o << "# ... also while its thread sleeps in the kernel (preload/shim_serial.c)\n"
        << "serial_sleep_keeps_turn = true\n";
    if (c.server.unchecked_greeting)
      o << "# what a server sends before a connection's first input is not compared\n"
        << "unchecked_greeting = true\n";
    if (!c.server.data_template.empty())
      o << "# each server starts from a copy of this directory (made by the profile's prepare)\n"
        << "data_template = " << TomlQuote(c.server.data_template) << "\n";
    if (!c.server.rendered_files.empty()) {
      // an array: a name with a comma in it reads back whole
      std::string list;
      for (const auto& f : c.server.rendered_files)
        list += (list.empty() ? "" : ", ") + TomlQuote(f);
      o << "# files of the template in which {port} and {dir} become the replica's\n"
        << "rendered_files = [" << list << "]\n";
    }
    if (!c.server.unchecked_replies.empty())
      o << "# replies not compared between replicas (preload/shim_unchecked.c)\n"
        << "unchecked_replies = " << TomlQuote(c.server.unchecked_replies) << "\n";
    if (!c.server.lease_reads.empty())
      o << "# read-only commands the leader answers without the log under its lease\n"
        << "lease_reads = " << TomlQuote(c.server.lease_reads) << "\n";
    if (c.server.lease_protocol == "memcached") o << "lease_protocol = \"memcached\"\n";
    if (!c.server.inspect_commands.empty())
      o << "# what `lockstep inspect` lets through (guard/server/inspection.h)\n"
        << "inspect_commands = " << TomlQuote(c.server.inspect_commands) << "\n";
    const CheckpointPolicy& p = c.checkpoint;
    o << "\n# CRIU checkpoints of each backup's server (checkpoint/README.md): after\n"
      << "# every_entries applied entries, every_log_bytes of log or every_seconds,\n"
      << "# whichever comes first; the newest `keep` are kept.\n"
      << "[checkpoint]\n"
      << "enabled = " << (p.enabled ? "true" : "false") << "\n"
      << "every_entries = " << p.every_entries << "\n"
      << "every_log_bytes = " << p.every_log_bytes << "\n"
      << "every_seconds = " << p.every_seconds << "\n"
      << "keep = " << p.keep << "\n"
      << "timeout_ms = " << p.timeout_ms << "\n"
      << "# a backup silent this long no longer holds the leader's log (it comes back\n"
      << "# from a checkpoint, fetched from a peer if need be)\n"
      << "lagging_backup_grace_seconds = " << p.lagging_backup_grace_s << "\n";
    if (p.file_locks)
      o << "# the server's file locks go into the images (criu --file-locks)\n"
        << "file_locks = true\n";
  }
  for (const auto& r : c.replicas) {
    o << "\n[[replica]]\n"
      << "id = " << r.id << "\n"
      << "host = " << TomlQuote(r.host) << "\n"
      << "peer_port = " << r.peer_port << "\n"
      << "client_port = " << r.client_port << "\n";
    if (c.has_server()) o << "server_port = " << r.server_port << "\n";
    o << "dir = " << TomlQuote(r.dir) << "\n";
    if (!r.netns.empty()) o << "netns = " << TomlQuote(r.netns) << "\n";
    if (r.removed) o << "# taken out of the cluster (lockstep member remove)\nremoved = true\n";
    if (r.metrics_port)
      o << "# Prometheus metrics: http://" << r.host << ":" << r.metrics_port << "/metrics\n"
        << "metrics_port = " << r.metrics_port << "\n";
  }
  return o.str();
}

namespace {
// 64 hex digits of SHA-256 of data ("" if OpenSSL fails).
std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) || len != 32)
    return "";
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; i++) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}
}  // namespace

std::string DerivedSecret(const std::string& secret, const std::string& label) {
  return Sha256Hex("lockstep " + label + " secret v1\n" + secret);
}

std::string ServerRandomSeed(const ClusterConfig& c) {
  if (!c.server.same_random) return "";
  // "": the shim then changes nothing (and the replicas may diverge)
  return Sha256Hex("lockstep same_random seed v1\n" + c.secret);
}

}  // namespace lockstep
