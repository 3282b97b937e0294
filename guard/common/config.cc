// config.cc — a strict parser for the TOML subset cluster.toml and the apps/
// profiles use, and cluster.toml itself.
#include "guard/common/config.h"

#include <arpa/inet.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "guard/common/command_line.h"
#include "preload/resp_scan.h"

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
  char quote = 0;  // '"' or '\'' inside a string
  for (size_t i = 0; i < s.size(); i++) {
    if (quote == '"' && s[i] == '\\') {
      i++;  // an escaped character, perhaps a quote
    } else if (quote) {
      if (s[i] == quote) quote = 0;
    } else if (s[i] == '"' || s[i] == '\'') {
      quote = s[i];
    } else if (s[i] == '#') {
      return s.substr(0, i);
    }
  }
  return s;
}

bool ParseString(const std::string& raw, std::string* out, std::string* why) {
  char quote = raw[0];
  std::string s;
  size_t i = 1;
  for (; i < raw.size() && raw[i] != quote; i++) {
    if (quote == '"' && raw[i] == '\\') {
      if (++i == raw.size()) break;
      switch (raw[i]) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        default:
          *why = std::string("unknown escape \\") + raw[i] + " in " + raw +
                 " (write \\\\ for a backslash, or use a 'literal string')";
          return false;
      }
    } else {
      s += raw[i];
    }
  }
  if (i >= raw.size()) {
    *why = "unterminated string " + raw;
    return false;
  }
  if (i + 1 != raw.size()) {
    *why = "unexpected text after the string: " + raw.substr(i + 1);
    return false;
  }
  *out = s;
  return true;
}

bool ParseValue(const std::string& raw, TomlValue* v, std::string* why) {
  if (raw.empty()) {
    *why = "missing value";
    return false;
  }
  if (raw[0] == '"' || raw[0] == '\'') {
    v->kind = TomlValue::kString;
    return ParseString(raw, &v->str, why);
  }
  if (raw == "true" || raw == "false") {
    v->kind = TomlValue::kBool;
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
    *why = "cannot read value " + raw + " (strings need quotes)";
    return false;
  }
  v->kind = TomlValue::kInt;
  v->num = n;
  return true;
}

bool IsBareKey(const std::string& k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

}  // namespace

// ------------------------------------------------------------ the TOML subset

bool TomlTable::Fail(int at, const std::string& msg, std::string* error) const {
  *error = path + ":" + std::to_string(at) + ": " + msg;
  return false;
}

int TomlTable::LineOf(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? line : it->second.line;
}

bool TomlTable::TakeString(const std::string& key, std::string* dst, bool required,
                           std::string* error) {
  auto it = fields.find(key);
  if (it == fields.end()) {
    if (!required) return true;
    return Fail(line, "field '" + key + "' missing in " + Name(), error);
  }
  if (it->second.kind != TomlValue::kString)
    return Fail(it->second.line, "field '" + key + "': expected a string in double quotes", error);
  *dst = it->second.str;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeInt(const std::string& key, int64_t* dst, bool required, int64_t lo, int64_t hi,
                        std::string* error) {
  auto it = fields.find(key);
  if (it == fields.end()) {
    if (!required) return true;
    return Fail(line, "field '" + key + "' missing in " + Name(), error);
  }
  if (it->second.kind != TomlValue::kInt)
    return Fail(it->second.line, "field '" + key + "': expected an integer", error);
  if (it->second.num < lo || it->second.num > hi)
    return Fail(it->second.line,
                "field '" + key + "': " + std::to_string(it->second.num) + " is outside " +
                    std::to_string(lo) + ".." + std::to_string(hi),
                error);
  *dst = it->second.num;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeBool(const std::string& key, bool* dst, std::string* error) {
  auto it = fields.find(key);
  if (it == fields.end()) return true;
  if (it->second.kind != TomlValue::kBool)
    return Fail(it->second.line, "field '" + key + "': expected true or false", error);
  *dst = it->second.num != 0;
  taken_.insert(key);
  return true;
}

bool TomlTable::TakeUncheckedReplies(std::string* dst, std::string* error) {
  std::string list;
  if (!TakeString("unchecked_replies", &list, false, error)) return false;
  resp_list parsed;
  if (resp_list_parse(&parsed, list.c_str()) != 0)
    return Fail(LineOf("unchecked_replies"),
                "field 'unchecked_replies': expected commands separated by commas, each one or "
                "two words of letters, digits, '_', '-' or '|' (at most " +
                    std::to_string(RESP_LIST) + " of them, words under " +
                    std::to_string(RESP_WORD) + " characters), e.g. \"INFO, CLIENT LIST\"",
                error);
  *dst = list;
  return true;
}

bool TomlTable::TakeFileList(const std::string& key, std::vector<std::string>* dst,
                             std::string* error) {
  std::string list;
  if (!TakeString(key, &list, false, error)) return false;
  dst->clear();
  if (Trim(list).empty()) return true;
  std::istringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    item = Trim(item);
    bool climbs = item == ".." || item.rfind("../", 0) == 0 ||
                  item.find("/../") != std::string::npos ||
                  (item.size() >= 3 && item.compare(item.size() - 3, 3, "/..") == 0);
    if (item.empty() || item[0] == '/' || climbs)
      return Fail(LineOf(key),
                  "field '" + key +
                      "': expected relative file paths separated by commas, none empty, "
                      "absolute or with '..' (got '" +
                      list + "')",
                  error);
    dst->push_back(item);
  }
  return true;
}

bool TomlTable::NoLeftovers(std::string* error) const {
  const std::pair<const std::string, TomlValue>* first = nullptr;
  for (const auto& f : fields)
    if (!taken_.count(f.first) && (!first || f.second.line < first->second.line)) first = &f;
  if (!first) return true;
  return Fail(first->second.line, "unknown field '" + first->first + "' in " + Name(), error);
}

bool ParseToml(const std::string& text, const std::string& path,
               const std::vector<std::string>& headers, bool top_level,
               std::vector<TomlTable>* tables, std::string* error) {
  std::vector<TomlTable> out;
  std::map<std::string, int> seen;  // [table] header -> its line
  TomlTable* current = nullptr;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto fail = [&](int at, const std::string& msg) {
    *error = path + ":" + std::to_string(at) + ": " + msg;
    return false;
  };
  auto new_table = [&](const std::string& header, int at) {
    out.emplace_back();
    out.back().path = path;
    out.back().header = header;
    out.back().line = at;
    current = &out.back();
  };
  while (std::getline(in, line)) {
    lineno++;
    std::string s = Trim(StripComment(line));
    if (s.empty()) continue;
    if (s[0] == '[') {
      bool known = false;
      for (const auto& h : headers) known |= s == h;
      if (!known) {
        std::string expected;
        for (size_t i = 0; i < headers.size(); i++)
          expected += (i ? i + 1 == headers.size() ? " or " : ", " : "") + headers[i];
        return fail(lineno, "unknown section " + s +
                                (headers.empty() ? " (this file has no sections)"
                                                 : " (expected " + expected + ")"));
      }
      if (s.rfind("[[", 0) != 0) {
        if (seen.count(s))
          return fail(lineno, s + " appears twice (first at line " + std::to_string(seen[s]) + ")");
        seen[s] = lineno;
      }
      new_table(s, lineno);
      continue;
    }
    size_t eq = s.find('=');
    if (eq == std::string::npos) return fail(lineno, "expected 'field = value', got: " + s);
    std::string key = Trim(s.substr(0, eq));
    if (!IsBareKey(key))
      return fail(lineno, "bad field name '" + key + "' (letters, digits, _ and - only)");
    if (!current) {
      if (!top_level) return fail(lineno, "field '" + key + "' outside any section");
      new_table("", 1);
    }
    TomlValue v;
    std::string why;
    if (!ParseValue(Trim(s.substr(eq + 1)), &v, &why))
      return fail(lineno, "field '" + key + "': " + why);
    v.line = lineno;
    auto dup = current->fields.find(key);
    if (dup != current->fields.end())
      return fail(lineno, "field '" + key + "' set twice (first at line " +
                              std::to_string(dup->second.line) + ")");
    current->fields[key] = v;
  }
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
    if (c == '"' || c == '\\') q += '\\';
    if (c == '\n') {
      q += "\\n";
    } else if (c == '\t') {
      q += "\\t";
    } else {
      q += c;
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
  auto fail = [&](int at, const std::string& msg) {
    *error = path + ":" + std::to_string(at) + ": " + msg;
    return false;
  };

  if (!cluster) return fail(1, "missing [cluster] section");
  TomlTable& t = *cluster;
  // A client's copy of cluster.toml may leave out what it must not hold.
  for (auto [name, value] : {std::pair<const char*, std::string*>{"secret", &c.secret},
                             {"client_secret", &c.client_secret},
                             {"admin_secret", &c.admin_secret}}) {
    if (!t.TakeString(name, value, false, error)) return false;
    if (t.Has(name) && value->size() < 16)
      return fail(t.LineOf(name),
                  std::string("field '") + name + "': must be at least 16 characters");
  }
  if (c.secret.empty() && c.client_secret.empty() && c.admin_secret.empty())
    return fail(1,
                "[cluster] needs 'secret' (the replicas'), or at least 'client_secret' in a "
                "client's copy");
  if (!c.secret.empty()) {
    if (c.client_secret.empty()) c.client_secret = DerivedSecret(c.secret, "client");
    if (c.admin_secret.empty()) c.admin_secret = DerivedSecret(c.secret, "admin");
  }
  if (!t.TakeString("keys", &c.keys, false, error)) return false;
  if (t.Has("keys") && c.keys.empty())
    return fail(t.LineOf("keys"), "field 'keys': empty (leave it out for \"keys\")");
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
      return fail(t.LineOf("leader_address"),
                  "field 'leader_address': '" + c.leader_address + "' is not IPV4:PORT");
    c.leader_host = c.leader_address.substr(0, colon);
    c.leader_port = port;
  }
  if (!t.TakeString("transport", &c.transport, false, error)) return false;
  if (c.transport != "shm" && c.transport != "tcp" && c.transport != "auto")
    return fail(t.LineOf("transport"),
                "field 'transport': '" + c.transport + "' is not shm, tcp or auto");
  if (!t.TakeString("durability", &c.durability, false, error)) return false;
  if (c.durability != "disk" && c.durability != "memory")
    return fail(t.LineOf("durability"),
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
    return fail(t.LineOf("election_timeout_max_us"),
                "field 'election_timeout_max_us' is below election_timeout_min_us");
  if (!t.NoLeftovers(error)) return false;

  if (server) {
    TomlTable& s = *server;
    if (!s.TakeString("command", &c.server.command, true, error)) return false;
    std::vector<std::string> argv;
    std::string why;
    if (!SplitCommand(c.server.command, &argv, &why))
      return fail(s.LineOf("command"), "field 'command': " + why);
    if (argv.empty()) return fail(s.LineOf("command"), "field 'command': is empty");
    if (!s.TakeString("app", &c.server.app, false, error)) return false;
    n = 0;
    if (!s.TakeInt("ready_timeout_ms", &n, false, 100, 3600000, error)) return false;
    if (n) c.server.ready_timeout_ms = n;
    if (!s.TakeString("ready_log", &c.server.ready_log, false, error)) return false;
    if (!s.TakeBool("same_random", &c.server.same_random, error)) return false;
    if (!s.TakeBool("same_clock", &c.server.same_clock, error)) return false;
    if (!s.TakeBool("timers_in_log", &c.server.timers_in_log, error)) return false;
    if (c.server.timers_in_log && !c.server.same_clock)
      return fail(s.LineOf("timers_in_log"),
                  "field 'timers_in_log' needs same_clock = true (a tick moves the clock)");
    if (!s.TakeBool("cloned_start", &c.server.cloned_start, error)) return false;
    if (!s.TakeString("state_probe", &c.server.state_probe, false, error)) return false;
    n = 0;
    if (!s.TakeInt("state_check_every_s", &n, false, 1, 86400, error)) return false;
    if (n) c.server.state_check_every_s = n;
    if (s.Has("state_check_every_s") && c.server.state_probe.empty())
      return fail(s.LineOf("state_check_every_s"),
                  "field 'state_check_every_s' needs a state_probe (the command it runs)");
    if (!s.TakeBool("serial_inputs", &c.server.serial_inputs, error)) return false;
    if (!s.TakeBool("serial_until_reply", &c.server.serial_until_reply, error)) return false;
    if (!s.TakeBool("serial_sleep_keeps_turn", &c.server.serial_sleep_keeps_turn, error))
      return false;
    for (const char* f : {"serial_until_reply", "serial_sleep_keeps_turn"})
      if (s.fields.count(f) && !c.server.serial_inputs)
        return fail(s.LineOf(f), std::string("field '") + f + "' needs serial_inputs = true");
    if (!s.TakeBool("unchecked_greeting", &c.server.unchecked_greeting, error)) return false;
    if (!s.TakeString("data_template", &c.server.data_template, false, error)) return false;
    if (!s.TakeFileList("rendered_files", &c.server.rendered_files, error)) return false;
    if (!c.server.rendered_files.empty() && c.server.data_template.empty())
      return fail(s.LineOf("rendered_files"),
                  "field 'rendered_files' names files of the data template, but there is no "
                  "data_template");
    if (!s.TakeUncheckedReplies(&c.server.unchecked_replies, error)) return false;
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
      return fail(k.line, "[checkpoint] without a [server] section (nothing to checkpoint)");
  }
  if (c.server.cloned_start && !c.checkpoint.enabled)
    return fail(server->LineOf("cloned_start"),
                "field 'cloned_start' needs [checkpoint] enabled = true (the replicas' servers "
                "start from a checkpoint of replica 0's)");

  if (replicas.empty()) return fail(1, "no [[replica]] sections");
  if (replicas.size() > 7) return fail(replicas[7]->line, "at most 7 replicas");
  for (TomlTable* rt : replicas) {
    ReplicaConfig r;
    int64_t id = -1, peer_port = 0, client_port = 0, server_port = 0;
    if (!rt->TakeInt("id", &id, true, 0, 6, error)) return false;
    if (id != static_cast<int64_t>(c.replicas.size()))
      return fail(rt->LineOf("id"), "field 'id': replicas must be numbered 0.." +
                                        std::to_string(replicas.size() - 1) +
                                        " in order; expected " + std::to_string(c.replicas.size()) +
                                        ", got " + std::to_string(id));
    r.id = static_cast<int>(id);
    if (!rt->TakeString("host", &r.host, true, error)) return false;
    if (!rt->TakeInt("peer_port", &peer_port, true, 1, 65535, error)) return false;
    if (!rt->TakeInt("client_port", &client_port, true, 1, 65535, error)) return false;
    if (server) {
      if (!rt->TakeInt("server_port", &server_port, true, 1, 65535, error)) return false;
    } else if (rt->Has("server_port")) {
      return fail(rt->LineOf("server_port"),
                  "field 'server_port' without a [server] section (no server to run)");
    }
    if (!rt->TakeString("dir", &r.dir, true, error)) return false;
    if (!rt->TakeString("netns", &r.netns, false, error)) return false;
    if (!rt->NoLeftovers(error)) return false;
    r.peer_port = static_cast<int>(peer_port);
    r.client_port = static_cast<int>(client_port);
    r.server_port = static_cast<int>(server_port);
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
        return fail(replicas[i]->LineOf("server_port"),
                    "field 'server_port': " + std::to_string(r.server_port) + " is also replica " +
                        std::to_string(o.id) + "'s " + clash + " on " + r.host);
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
      std::string list;
      for (const auto& f : c.server.rendered_files) list += (list.empty() ? "" : ", ") + f;
      o << "# files of the template in which {port} and {dir} become the replica's\n"
        << "rendered_files = " << TomlQuote(list) << "\n";
    }
    if (!c.server.unchecked_replies.empty())
      o << "# replies not compared between replicas (preload/shim_unchecked.c)\n"
        << "unchecked_replies = " << TomlQuote(c.server.unchecked_replies) << "\n";
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
