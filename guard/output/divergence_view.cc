// divergence_view.cc — see divergence_view.h.
#include "guard/output/divergence_view.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "guard/server/log_input.h"  // EscapeBytes

namespace lockstep {

namespace {

// A value for people: a string as is, a number as digits (a fraction to one
// decimal), "" when missing.
std::string Shown(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char b[64];
    snprintf(b, sizeof b, "%.1f", v.get<double>());
    return b;
  }
  if (v.is_number() || v.is_boolean()) return v.dump();
  return "";
}

std::string Field(const Json& r, const char* key) {
  return Shown(JsonAt(r, key));
}

// The items of an array field, each as Field would show it.
std::vector<std::string> Items(const Json& r, const char* key) {
  std::vector<std::string> out;
  const Json& v = JsonAt(r, key);
  if (!v.is_array()) return out;
  for (const Json& x : v) out.push_back(Shown(x));
  return out;
}

// The log window's fields: "from..to (N inputs of all connections)".
std::string Window(const Json& r) {
  const Json& w = JsonAt(r, "log_window");
  return Field(w, "from") + ".." + Field(w, "to") + " (" + Field(w, "inputs") +
         " inputs of all connections)";
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& a : items) out += (out.empty() ? "" : ", ") + a;
  return out;
}

}  // namespace

std::vector<ReportOutput> ReportOutputs(const Json& report) {
  std::vector<ReportOutput> outs;
  const Json& list = JsonAt(report, "outputs");
  if (!list.is_array()) return outs;
  for (const Json& x : list) {
    ReportOutput o;
    o.bytes = BytesFromJson(JsonStr(x, "bytes"));
    o.start = JsonU64(x, "start");
    int64_t replica = JsonI64(x, "from_replica", -1);
    o.replica = replica >= 0 && replica <= INT32_MAX ? static_cast<int>(replica) : -1;
    o.note = JsonStr(x, "note");
    o.kept = JsonBool(x, "kept");
    outs.push_back(std::move(o));
  }
  return outs;
}

// A time in ms since the epoch, local as `divergence list` shows it ("?"
// when absent).
static std::string UnixMsText(uint64_t ms) {
  if (ms == 0) return "?";
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm t;
  localtime_r(&secs, &t);
  char out[40];
  strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S", &t);
  return out;
}

// A state report's state_agreed_index, for people.
std::string StateAgreed(const std::string& index) {
  return index.empty() || index == "0"
             ? "no earlier check is known to have agreed (since this leader leads)"
             : "last agreed with the reference's at entry " + index + " (an earlier check)";
}

std::string ReportText(const Json& r) {
  std::string o;
  auto f = [&](const char* k) { return Field(r, k); };
  auto line = [&o](const std::string& name, const std::string& text) {
    o += "  " + name + std::string(name.size() < 12 ? 12 - name.size() : 1, ' ') + text + "\n";
  };
  bool state = f("kind") == "state", leader_diverged = JsonBool(r, "leader_diverged");
  o += "divergence " + f("id") + ": " + f("status") + "\n";
  line("kind", state ? "state: the answers to a state check's probe differed"
                     : "output: the replies to a client differed");
  line("found by", "leader " + f("leader") + ", " +
                       (leader_diverged ? "which is itself the divergent replica"
                                        : "replica " + f("replica") + " diverged"));
  std::string agreeing = Join(Items(r, "agreeing"));
  line("agreeing", agreeing.empty() ? "(no other replica had reported there)" : agreeing);
  line("connection", f("connection") + ", output differs at or before byte " + f("offset") +
                         " (last agreeing check: byte " + f("agreed_offset") + ")");
  line("log window", "entries " + Window(r));
  if (state) line("state", StateAgreed(f("state_agreed_index")));
  if (leader_diverged && JsonI64(r, "new_leader", -1) >= 0)
    line("new leader",
         "replica " + f("new_leader") + ", " + f("new_leader_ms") + " ms after the verdict");
  line("repair",
       f("how") + ": " + f("action") + (f("error").empty() ? "" : "; error: ") + f("error"));
  if (!f("hint").empty()) line("hint", f("hint"));
  if (f("status") == "recurring")
    line("recurring", "found " + f("recurrences") + " time(s), the last at " +
                          UnixMsText(JsonU64(r, "recurred_unix_ms")));
  if (f("status") == "repaired" || f("status") == "failed")
    o += "              restored checkpoint " + f("restored_index") + " in " + f("restore_ms") +
         " ms; in sync again after " + f("total_ms") + " ms\n";
  o += "  inputs of the connection in the window (the last ones):\n";
  std::vector<std::string> inputs = Items(r, "connection_inputs");
  if (inputs.empty()) o += "    (none in the log window)\n";
  for (const auto& in : inputs) o += "    " + BytesFromJson(in) + "\n";  // described
  int64_t diff = JsonI64(r, "first_difference", -1);
  o += "  outputs" +
       (diff >= 0 ? " (first different byte: " + std::to_string(diff) + ", marked >>)"
                  : std::string()) +
       ":\n";
  for (const ReportOutput& x : ReportOutputs(r)) {
    o += "    replica " + std::to_string(x.replica) + " (" + x.note + "):\n";
    if (!x.kept) continue;
    // Around the difference: 160 bytes before, 160 after; a difference
    // outside the excerpt (or a report that says so) marks its end.
    uint64_t end = x.start + std::min<uint64_t>(x.bytes.size(), UINT64_MAX - x.start);
    uint64_t at = diff >= 0 ? std::clamp(static_cast<uint64_t>(diff), x.start, end) : end;
    uint64_t lo = at - x.start > 160 ? at - 160 : x.start;
    uint64_t hi = end - at > 160 ? at + 160 : end;
    o += "      [byte " + std::to_string(lo) + "] " +
         EscapeBytes(std::string_view(x.bytes).substr(lo - x.start, at - lo)) +
         (diff >= 0 ? " >>" : "") +
         EscapeBytes(std::string_view(x.bytes).substr(at - x.start, hi - at)) + "\n";
  }
  std::string indented;
  for (char c : f("stack"))
    indented += c == '\n' ? std::string("\n                ") : std::string(1, c);
  line("stack", indented);
  return o;
}

namespace {

std::string Html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Output bytes for the page: escaped like EscapeBytes, and a line break
// after each \n so that a protocol's lines read as lines.
std::string HtmlBytes(const std::string& bytes) {
  std::string out;
  for (char c : bytes) {
    out += Html(EscapeBytes(std::string(1, c)));
    if (c == '\n') out += '\n';
  }
  return out;
}

}  // namespace

std::string ReportHtml(const Json& r) {
  auto f = [&](const char* k) { return Field(r, k); };
  std::string id = f("id");
  int64_t diff = JsonI64(r, "first_difference", -1);
  bool leader_diverged = JsonBool(r, "leader_diverged");
  std::string o;
  o += "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>lockstep divergence " +
       Html(id) + "</title>\n<style>\n";
  o += "body{font-family:sans-serif;margin:1.5em;color:#222}"
       "table.facts td{padding:2px 12px 2px 0;vertical-align:top}"
       "table.facts td:first-child{color:#666;white-space:nowrap}"
       ".outs{display:flex;gap:1em;align-items:flex-start}"
       ".out{flex:1;min-width:0;border:1px solid #ccc;border-radius:4px}"
       ".out h3{margin:0;padding:6px 10px;background:#f3f3f3;font-size:1em}"
       ".out.ref h3{background:#e3f0e3}.out.div h3{background:#f6e0e0}"
       "pre{margin:0;padding:8px 10px;white-space:pre-wrap;word-break:break-all;"
       "font-size:12px}"
       "mark{background:#ffd54f;outline:1px solid #e65100}"
       ".after{background:#fdecea}ul.inputs{font-family:monospace;font-size:12px}\n";
  o += "</style></head><body>\n";
  o += "<h1>Divergence " + Html(id) + ": " + Html(f("status")) + "</h1>\n<table class=\"facts\">\n";
  auto row = [&](const std::string& k, const std::string& v) {
    o += "<tr><td>" + Html(k) + "</td><td>" + Html(v) + "</td></tr>\n";
  };
  std::string agreeing = Join(Items(r, "agreeing"));
  row("divergent replica",
      leader_diverged ? "the leader, replica " + f("replica")
                      : "replica " + f("replica") + " (leader: replica " + f("leader") + ")");
  row("agreeing with the reference",
      agreeing.empty() ? "no other replica had reported there" : "replicas " + agreeing);
  row("kind", f("kind") == "state" ? "state (the answers to a state check's probe)"
                                   : "output (the replies to a client)");
  row("connection", f("connection"));
  row("first different byte", diff >= 0 ? std::to_string(diff) : "not in the kept outputs");
  row("checked", "equal up to byte " + f("agreed_offset") + ", different at byte " + f("offset"));
  row("log window", "entries " + Window(r));
  if (f("kind") == "state") row("state", StateAgreed(f("state_agreed_index")));
  if (leader_diverged && JsonI64(r, "new_leader", -1) >= 0)
    row("new leader",
        "replica " + f("new_leader") + ", " + f("new_leader_ms") + " ms after the verdict");
  row("repair",
      f("how") + ": " + f("action") + (f("error").empty() ? "" : "; error: " + f("error")));
  if (f("status") == "repaired" || f("status") == "failed")
    row("took", "restore " + f("restore_ms") + " ms, in sync again after " + f("total_ms") + " ms");
  if (!f("hint").empty()) row("hint", f("hint"));
  if (f("status") == "recurring")
    row("recurring", "found " + f("recurrences") + " time(s), the last at " +
                         UnixMsText(JsonU64(r, "recurred_unix_ms")));
  if (!f("stack").empty())
    o += "<tr><td>stack at the send</td><td><pre>" + Html(f("stack")) + "</pre></td></tr>\n";
  o += "</table>\n<h2>Inputs of the connection in the window</h2>\n<ul class=\"inputs\">\n";
  for (const auto& in : Items(r, "connection_inputs"))
    o += "<li>" + Html(BytesFromJson(in)) + "</li>\n";
  o += "</ul>\n<h2>Outputs";
  if (diff >= 0) o += " (the first different byte is marked)";
  o += "</h2>\n<div class=\"outs\">\n";
  std::string leader = f("leader"), divergent = f("replica");
  for (const ReportOutput& out : ReportOutputs(r)) {
    std::string cls = std::to_string(out.replica) == leader ? "ref" : "div";
    o += "<div class=\"out " + cls + "\"><h3>replica " + std::to_string(out.replica) +
         (cls == "ref" ? " (leader)" : "") + ": " + Html(out.note) + "</h3>\n<pre>";
    if (out.kept) {
      if (diff >= 0 && static_cast<uint64_t>(diff) >= out.start &&
          static_cast<uint64_t>(diff) - out.start < out.bytes.size()) {
        size_t at = static_cast<size_t>(diff - out.start);
        o += "<span title=\"from byte " + std::to_string(out.start) + "\">" +
             HtmlBytes(out.bytes.substr(0, at)) + "</span><mark>" +
             HtmlBytes(out.bytes.substr(at, 1)) + "</mark><span class=\"after\">" +
             HtmlBytes(out.bytes.substr(at + 1)) + "</span>";
      } else {
        o += HtmlBytes(out.bytes);
      }
    }
    o += "</pre></div>\n";
  }
  o += "</div>\n</body></html>\n";
  return o;
}

}  // namespace lockstep
