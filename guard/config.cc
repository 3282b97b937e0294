// config.cc — a strict parser for the TOML subset cluster.toml uses.
#include "guard/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

namespace lockstep {

namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// Strips a trailing comment that is not inside a string.
std::string StripComment(const std::string& s) {
  bool in_string = false;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '"' && (i == 0 || s[i - 1] != '\\')) in_string = !in_string;
    if (s[i] == '#' && !in_string) return s.substr(0, i);
  }
  return s;
}

struct Value {
  enum Kind { kString, kInt, kBool } kind;
  std::string str;
  int64_t num = 0;
  int line = 0;
};

bool ParseValue(const std::string& raw, Value* v, std::string* why) {
  if (raw.empty()) {
    *why = "missing value";
    return false;
  }
  if (raw[0] == '"') {
    if (raw.size() < 2 || raw.back() != '"') {
      *why = "unterminated string " + raw;
      return false;
    }
    v->kind = Value::kString;
    std::string s;
    for (size_t i = 1; i + 1 < raw.size(); i++) {
      if (raw[i] == '\\' && i + 2 < raw.size()) {
        char c = raw[++i];
        s += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        s += raw[i];
      }
    }
    v->str = s;
    return true;
  }
  if (raw == "true" || raw == "false") {
    v->kind = Value::kBool;
    v->num = raw == "true";
    return true;
  }
  std::string digits;
  for (char c : raw)
    if (c != '_') digits += c;
  char* end = nullptr;
  errno = 0;
  long long n = strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || *end != '\0' || errno != 0) {
    *why = "cannot read value " + raw + " (strings need double quotes)";
    return false;
  }
  v->kind = Value::kInt;
  v->num = n;
  return true;
}

}  // namespace

bool ParseClusterConfig(const std::string& text, const std::string& path, ClusterConfig* out,
                        std::string* error) {
  ClusterConfig c;
  c.path = path;
  using Table = std::map<std::string, Value>;
  Table cluster;
  int cluster_line = 0;
  std::vector<std::pair<int, Table>> replicas;  // header line, fields
  Table* current = nullptr;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto fail = [&](int at, const std::string& msg) {
    *error = path + ":" + std::to_string(at) + ": " + msg;
    return false;
  };
  while (std::getline(in, line)) {
    lineno++;
    std::string s = Trim(StripComment(line));
    if (s.empty()) continue;
    if (s == "[cluster]") {
      if (cluster_line)
        return fail(lineno,
                    "[cluster] appears twice (first at line " + std::to_string(cluster_line) + ")");
      cluster_line = lineno;
      current = &cluster;
      continue;
    }
    if (s == "[[replica]]") {
      replicas.push_back({lineno, {}});
      current = &replicas.back().second;
      continue;
    }
    if (s[0] == '[')
      return fail(lineno, "unknown section " + s + " (expected [cluster] or [[replica]])");
    size_t eq = s.find('=');
    if (eq == std::string::npos) return fail(lineno, "expected 'field = value', got: " + s);
    std::string key = Trim(s.substr(0, eq));
    if (!current) return fail(lineno, "field '" + key + "' outside any section");
    Value v;
    std::string why;
    if (!ParseValue(Trim(s.substr(eq + 1)), &v, &why))
      return fail(lineno, "field '" + key + "': " + why);
    v.line = lineno;
    if (current->count(key))
      return fail(lineno, "field '" + key + "' set twice (first at line " +
                              std::to_string((*current)[key].line) + ")");
    (*current)[key] = v;
  }

  // Typed extraction with errors that name field and line.
  auto get_string = [&](Table& t, const char* key, std::string* dst, bool required,
                        int section_line, const char* section) -> bool {
    auto it = t.find(key);
    if (it == t.end()) {
      if (!required) return true;
      return fail(section_line, std::string("field '") + key + "' missing in " + section);
    }
    if (it->second.kind != Value::kString)
      return fail(it->second.line,
                  std::string("field '") + key + "': expected a string in double quotes");
    *dst = it->second.str;
    t.erase(it);
    return true;
  };
  auto get_int = [&](Table& t, const char* key, int64_t* dst, bool required, int section_line,
                     const char* section, int64_t lo, int64_t hi) -> bool {
    auto it = t.find(key);
    if (it == t.end()) {
      if (!required) return true;
      return fail(section_line, std::string("field '") + key + "' missing in " + section);
    }
    if (it->second.kind != Value::kInt)
      return fail(it->second.line, std::string("field '") + key + "': expected an integer");
    if (it->second.num < lo || it->second.num > hi)
      return fail(it->second.line, std::string("field '") + key +
                                       "': " + std::to_string(it->second.num) + " is outside " +
                                       std::to_string(lo) + ".." + std::to_string(hi));
    *dst = it->second.num;
    t.erase(it);
    return true;
  };
  auto no_leftovers = [&](Table& t, const char* section) -> bool {
    if (t.empty()) return true;
    return fail(t.begin()->second.line, "unknown field '" + t.begin()->first + "' in " + section);
  };

  if (!cluster_line) return fail(1, "missing [cluster] section");
  std::map<std::string, int> cluster_lines;  // field -> line, for checks after extraction
  for (const auto& [k, v] : cluster) cluster_lines[k] = v.line;
  if (!get_string(cluster, "secret", &c.secret, true, cluster_line, "[cluster]")) return false;
  if (c.secret.size() < 16)
    return fail(cluster_lines["secret"], "field 'secret': must be at least 16 characters");
  if (!get_string(cluster, "transport", &c.transport, false, cluster_line, "[cluster]"))
    return false;
  if (c.transport != "shm" && c.transport != "tcp" && c.transport != "auto")
    return fail(cluster_lines["transport"],
                "field 'transport': '" + c.transport + "' is not shm, tcp or auto");
  if (!get_string(cluster, "durability", &c.durability, false, cluster_line, "[cluster]"))
    return false;
  if (c.durability != "disk" && c.durability != "memory")
    return fail(cluster_lines["durability"],
                "field 'durability': '" + c.durability + "' is not disk or memory");
  int64_t n = 0;
  if (!get_int(cluster, "ring_bytes", &n, false, cluster_line, "[cluster]", 1 << 16,
               int64_t{1} << 34))
    return false;
  if (n) c.ring_bytes = n;
  n = 0;
  if (!get_int(cluster, "segment_bytes", &n, false, cluster_line, "[cluster]", 1 << 16,
               int64_t{1} << 34))
    return false;
  if (n) c.segment_bytes = n;
  n = 0;
  if (!get_int(cluster, "heartbeat_us", &n, false, cluster_line, "[cluster]", 100, 1000000))
    return false;
  if (n) c.heartbeat_us = n;
  n = -1;
  if (!get_int(cluster, "spin_us", &n, false, cluster_line, "[cluster]", 0, 1000000)) return false;
  if (n >= 0) c.spin_us = n;
  n = 0;
  if (!get_int(cluster, "election_timeout_min_us", &n, false, cluster_line, "[cluster]", 1000,
               60000000))
    return false;
  if (n) c.election_timeout_min_us = n;
  n = 0;
  if (!get_int(cluster, "election_timeout_max_us", &n, false, cluster_line, "[cluster]", 1000,
               60000000))
    return false;
  if (n) c.election_timeout_max_us = n;
  if (c.election_timeout_max_us < c.election_timeout_min_us)
    return fail(cluster_lines.count("election_timeout_max_us")
                    ? cluster_lines["election_timeout_max_us"]
                    : cluster_line,
                "field 'election_timeout_max_us' is below election_timeout_min_us");
  if (!no_leftovers(cluster, "[cluster]")) return false;

  if (replicas.empty()) return fail(lineno, "no [[replica]] sections");
  if (replicas.size() > 7) return fail(replicas[7].first, "at most 7 replicas");
  for (auto& [at, t] : replicas) {
    ReplicaConfig r;
    int64_t id = -1, peer_port = 0, client_port = 0;
    int id_line = t.count("id") ? t["id"].line : at;
    if (!get_int(t, "id", &id, true, at, "[[replica]]", 0, 6)) return false;
    if (id != static_cast<int64_t>(c.replicas.size()))
      return fail(id_line, "field 'id': replicas must be numbered 0.." +
                               std::to_string(replicas.size() - 1) + " in order; expected " +
                               std::to_string(c.replicas.size()) + ", got " + std::to_string(id));
    r.id = static_cast<int>(id);
    if (!get_string(t, "host", &r.host, true, at, "[[replica]]")) return false;
    if (!get_int(t, "peer_port", &peer_port, true, at, "[[replica]]", 1, 65535)) return false;
    if (!get_int(t, "client_port", &client_port, true, at, "[[replica]]", 1, 65535)) return false;
    if (!get_string(t, "dir", &r.dir, true, at, "[[replica]]")) return false;
    if (!get_string(t, "netns", &r.netns, false, at, "[[replica]]")) return false;
    if (!no_leftovers(t, "[[replica]]")) return false;
    r.peer_port = static_cast<int>(peer_port);
    r.client_port = static_cast<int>(client_port);
    c.replicas.push_back(r);
  }
  *out = c;
  return true;
}

bool LoadClusterConfig(const std::string& path, ClusterConfig* out, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = path + ": cannot open: " + strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseClusterConfig(ss.str(), path, out, error);
}

std::string FormatClusterConfig(const ClusterConfig& c) {
  std::ostringstream o;
  o << "# lockstep cluster configuration: the same file on every replica.\n"
    << "[cluster]\n"
    << "secret = \"" << c.secret << "\"\n"
    << "transport = \"" << c.transport << "\"\n"
    << "durability = \"" << c.durability << "\"\n"
    << "ring_bytes = " << c.ring_bytes << "\n"
    << "segment_bytes = " << c.segment_bytes << "\n"
    << "heartbeat_us = " << c.heartbeat_us << "\n"
    << "spin_us = " << c.spin_us << "\n"
    << "election_timeout_min_us = " << c.election_timeout_min_us << "\n"
    << "election_timeout_max_us = " << c.election_timeout_max_us << "\n";
  for (const auto& r : c.replicas) {
    o << "\n[[replica]]\n"
      << "id = " << r.id << "\n"
      << "host = \"" << r.host << "\"\n"
      << "peer_port = " << r.peer_port << "\n"
      << "client_port = " << r.client_port << "\n"
      << "dir = \"" << r.dir << "\"\n";
    if (!r.netns.empty()) o << "netns = \"" << r.netns << "\"\n";
  }
  return o.str();
}

}  // namespace lockstep
