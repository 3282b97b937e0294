// answers.cc — reading a daemon's JSON answers (answers.h).
#include "guard/net/answers.h"

namespace lockstep {

bool ParseDaemonStatus(std::string_view text, DaemonStatus* s, std::string* error) {
  Json j;
  *s = DaemonStatus{};
  if (!ParseJson(text, &j, error)) return false;
  if (!j.is_object()) {
    *error = "the status is not a JSON object";
    return false;
  }
  s->role = JsonStr(j, "role");
  s->ballot = JsonStr(j, "ballot");
  s->disk_error = JsonStr(j, "disk_error");
  s->commit_index = JsonU64(j, "commit_index");
  s->last_index = JsonU64(j, "last_index");
  s->first_index = JsonU64(j, "first_index");
  s->applied_index = JsonU64(j, "applied_index");
  s->lease_left_us = JsonU64(j, "lease_left_us");
  s->lease_guard_left_us = JsonU64(j, "lease_guard_left_us");
  s->lease_reads = JsonU64(j, "lease_reads");
  s->lease_misses = JsonU64(j, "lease_misses");
  s->server_read_all = JsonBool(j, "server_read_all", true);
  s->serving = JsonBool(j, "serving", false);
  int64_t pid = JsonI64(j, "server_pid");
  s->server_pid = pid > 0 && pid <= INT32_MAX ? static_cast<int>(pid) : 0;
  auto object = [&j](const char* key) {
    const Json& v = JsonAt(j, key);
    return v.is_object() ? v : Json();
  };
  s->checkpoint = object("checkpoint");
  s->output = object("output");
  s->state_checks = object("state_checks");
  s->membership = object("membership");
  const Json& peers = JsonAt(j, "peers");
  s->peers = peers.is_array() ? peers : Json::array();
  return true;
}

bool ParseCheckpointList(std::string_view text, std::vector<CheckpointListItem>* items,
                         std::string* error) {
  Json j;
  if (!ParseJson(text, &j, error)) return false;
  if (!j.is_array()) {
    *error = "the checkpoint list is not a JSON array";
    return false;
  }
  for (Json& x : j) {
    if (!x.is_object()) continue;
    CheckpointListItem c;
    int64_t replica = JsonI64(x, "replica", -1);
    c.replica = replica >= 0 && replica <= INT32_MAX ? static_cast<int>(replica) : -1;
    c.index = JsonU64(x, "index");
    c.bytes = JsonU64(x, "bytes");
    c.time_unix = JsonI64(x, "time_unix");
    c.dump_us = JsonI64(x, "dump_us");
    c.ok = JsonBool(x, "ok");
    c.path = JsonStr(x, "path");
    c.error = JsonStr(x, "error");
    c.json = std::move(x);
    items->push_back(std::move(c));
  }
  return true;
}

}  // namespace lockstep
