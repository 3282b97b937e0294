// divergence_report.cc — see divergence_report.h.
#include "guard/output/divergence_report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "consensus/core.h"  // BallotString
#include "guard/common/json.h"

namespace lockstep {

namespace fs = std::filesystem;

int64_t FirstDifference(const OutputExcerpt& a, const OutputExcerpt& b, uint64_t from,
                        uint64_t to) {
  if (!a.have || !b.have) return -1;
  uint64_t lo = std::max({from, a.start, b.start});
  uint64_t hi = std::min({to, a.start + a.bytes.size(), b.start + b.bytes.size()});
  for (uint64_t o = lo; o < hi; o++)
    if (a.bytes[o - a.start] != b.bytes[o - b.start]) return static_cast<int64_t>(o);
  return -1;
}

std::string StackAt(const OutputExcerpt& x, int64_t at) {
  std::string who = "replica " + std::to_string(x.replica) + "'s server";
  if (x.sends.empty()) return "not captured (" + who + " sent nothing recorded on the connection)";
  const SendStack* best = nullptr;
  for (const SendStack& s : x.sends)
    if (at < 0 || s.start <= static_cast<uint64_t>(at)) best = &s;  // oldest first
  if (!best) best = &x.sends.front();
  bool covers =
      at >= 0 && best->start <= static_cast<uint64_t>(at) && static_cast<uint64_t>(at) < best->end;
  return who + ", at the send of bytes " + std::to_string(best->start) + ".." +
         std::to_string(best->end) +
         (covers    ? " (the first different byte's)"
          : at >= 0 ? " (the newest kept before the first different byte)"
                    : " (its newest)") +
         ":\n" + best->frames;
}

std::string DivergenceReport::ToJson() const {
  char reference[32], divergent[32];
  snprintf(reference, sizeof reference, "%016llx", (unsigned long long)leader_digest);
  snprintf(divergent, sizeof divergent, "%016llx", (unsigned long long)replica_digest);
  // Inputs and outputs are bytes, not text: one code point per byte.
  Json connection_inputs = Json::array(), excerpts = Json::array();
  for (const std::string& in : inputs) connection_inputs.push_back(JsonFromBytes(in));
  for (const OutputExcerpt& x : outputs)
    excerpts.push_back({{"from_replica", x.replica},
                        {"kept", x.have},
                        {"start", x.start},
                        {"length", x.bytes.size()},
                        {"bytes", JsonFromBytes(x.bytes)},
                        {"note", x.note}});
  // Summary fields first: a person reading the file sees them at its top.
  return JsonText(
      Json{{"id", id},
           {"time_unix", time_unix},
           {"found_unix_ms", found_unix_ms},
           {"done_unix_ms", done_unix_ms},
           {"status", status},
           {"kind", kind},
           {"replica", replica},
           {"leader", leader},
           {"leader_diverged", leader_diverged},
           {"how", how},
           {"connection", BallotString(key.ballot) + "/" + std::to_string(key.no)},
           {"offset", offset},
           {"total_ms", total_ms},
           {"action", action},
           {"error", error},
           {"hint", hint},
           {"recurrences", recurrences},
           {"recurred_unix_ms", recurred_unix_ms},
           {"agreeing", agreeing},
           {"agreed_offset", agreed_offset},
           {"reference_digest", reference},
           {"divergent_digest", divergent},
           {"state_agreed_index", state_agreed_index},
           {"log_window", {{"from", window_from}, {"to", window_to}, {"inputs", inputs_in_window}}},
           {"connection_inputs", std::move(connection_inputs)},
           {"first_difference", first_difference},
           {"outputs", std::move(excerpts)},
           {"restored_index", restored_index},
           {"restore_ms", restore_ms},
           {"new_leader", new_leader},
           {"new_leader_ms", new_leader_ms},
           {"stack", stack}});
}

bool WriteReport(const std::string& dir, const DivergenceReport& report, std::string* error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string final_path = dir + "/" + report.id + ".json";
  std::string tmp = final_path + ".tmp";
  std::string text = report.ToJson() + "\n";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write " + tmp + ": " + strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = "cannot write " + tmp + ": " + strerror(errno);
      close(fd);
      unlink(tmp.c_str());
      return false;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    *error = "cannot fsync " + tmp + ": " + strerror(errno);
    close(fd);
    unlink(tmp.c_str());
    return false;
  }
  close(fd);
  if (rename(tmp.c_str(), final_path.c_str()) != 0) {
    *error = "cannot rename " + tmp + ": " + strerror(errno);
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

namespace {
// "<leader>-<n>.json" -> n, or 0.
uint64_t ReportNumber(const std::string& name, int leader) {
  std::string prefix = std::to_string(leader) + "-";
  if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 6 ||
      name.substr(name.size() - 5) != ".json")
    return 0;
  std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 5);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoull(digits);
}
}  // namespace

uint64_t NextReportNumber(const std::string& dir, int leader) {
  uint64_t next = 1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    next = std::max(next, ReportNumber(e.path().filename().string(), leader) + 1);
  return next;
}

Json ReportFromText(std::string_view text, const std::string& id) {
  Json report;
  std::string why;
  if (ParseJson(text, &report, &why) && report.is_object()) return report;
  if (why.empty()) why = "not a JSON object";
  return Json{
      {"id", id}, {"status", "unreadable"}, {"error", "the report file is damaged: " + why}};
}

namespace {
bool ReadText(const fs::path& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}
}  // namespace

std::vector<Json> ReadReports(const std::string& dir) {
  std::vector<std::pair<std::pair<uint64_t, std::string>, Json>> reports;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    std::string text;
    if (!ReadText(e.path(), &text) || text.find_first_not_of(" \n") == std::string::npos) continue;
    Json r = ReportFromText(text, e.path().stem().string());
    std::pair<uint64_t, std::string> when{JsonU64(r, "time_unix"), JsonStr(r, "id")};
    reports.push_back({std::move(when), std::move(r)});
  }
  std::sort(reports.begin(), reports.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<Json> out;
  for (auto& r : reports) out.push_back(std::move(r.second));
  return out;
}

std::string DivergenceAnswer(const std::string& dir, const DivergenceRequest& req) {
  if (req.op == DivergenceOp::kShow) {
    // A report's id is digits and a dash: nothing that names another file.
    if (req.id.empty() || req.id.find_first_not_of("0123456789-") != std::string::npos) return "";
    std::string text;
    if (!ReadText(dir + "/" + req.id + ".json", &text)) return "";
    return JsonText(ReportFromText(text, req.id));
  }
  return JsonText(Json(ReadReports(dir)));
}

std::string RequestCommand(const std::string& request) {
  std::string word;
  if (!request.empty() && request[0] == '*') {  // *N\r\n$LEN\r\nNAME\r\n
    size_t bulk = request.find("\r\n$");
    size_t at = bulk == std::string::npos ? bulk : request.find("\r\n", bulk + 3);
    if (at == std::string::npos) return "";
    size_t end = request.find("\r\n", at + 2);
    if (end == std::string::npos) return "";  // cut short
    word = request.substr(at + 2, end - at - 2);
  } else {
    word = request.substr(0, request.find_first_of(" \r\n"));
  }
  if (word.empty() || word.size() > 32) return "";
  for (char& c : word) {
    if (c <= ' ' || c > '~') return "";
    c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  }
  return word;
}

std::string DivergenceHint(const ClusterConfig::ServerConfig& server, const std::string& kind,
                           bool data_in_window, const std::string& last_command) {
  const std::string again = "if it comes back at the same place after its repair, ";
  if (kind == "output" && !data_in_window && !server.unchecked_greeting)
    return again +
           "what the server sends before a connection's first input differs by nature (a "
           "greeting's salt or thread id): unchecked_greeting = true in the app profile leaves "
           "it unchecked";
  if (!server.same_random && !server.same_clock)
    return again +
           "the server draws random numbers (redis SPOP, a salt) or reads the wall clock (redis "
           "TIME) its own way on each replica: same_random = true and same_clock = true in the "
           "app profile make every replica draw the same and read the leader's time of each "
           "input";
  if (!server.same_random)
    return again +
           "the server draws random numbers its own way on each replica (redis SPOP, a salt): "
           "same_random = true in the app profile makes every replica draw the same";
  if (!server.same_clock)
    return again +
           "the server reads the wall clock its own way on each replica: same_clock = true in "
           "the app profile gives every replica the leader's time of each input";
  if (kind == "output" && !last_command.empty())
    return again + "the reply to " + last_command +
           " differs by nature (a pid, a port, a duration): list " + last_command +
           " in unchecked_replies in the app profile";
  return "";
}

}  // namespace lockstep
