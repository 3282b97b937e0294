// divergence_view.cc — see divergence_view.h.
#include "guard/output/divergence_view.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "guard/common/json.h"       // JsonField
#include "guard/server/log_input.h"  // EscapeBytes

namespace lockstep {

// The top-level items of a JSON array (objects or strings), as texts.
std::vector<std::string> JsonItems(const std::string& json, size_t open) {
  std::vector<std::string> items;
  if (open >= json.size() || json[open] != '[') return items;
  int depth = 0;
  bool in_string = false;
  size_t start = open + 1;
  for (size_t i = open + 1; i < json.size(); i++) {
    char c = json[i];
    if (in_string) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[')
      depth++;
    else if ((c == '}' || c == ']') && depth > 0)
      depth--;
    else if ((c == ',' || c == ']') && depth == 0) {
      std::string item = json.substr(start, i - start);
      if (item.find_first_not_of(" \n") != std::string::npos) items.push_back(item);
      start = i + 1;
      if (c == ']') break;
    }
  }
  return items;
}

std::vector<std::string> JsonArrayField(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\":[");
  return at == std::string::npos ? std::vector<std::string>{}
                                 : JsonItems(json, at + key.size() + 3);
}

// A JSON string literal (quotes included) as bytes: \u00XX is one byte.
std::string JsonStringBytes(const std::string& lit) {
  std::string out;
  for (size_t i = 1; i + 1 < lit.size(); i++) {
    char c = lit[i];
    if (c != '\\' || i + 2 >= lit.size()) {
      out += c;
      continue;
    }
    char e = lit[++i];
    if (e == 'n')
      out += '\n';
    else if (e == 'r')
      out += '\r';
    else if (e == 't')
      out += '\t';
    else if (e == 'u' && i + 4 < lit.size()) {
      out += static_cast<char>(std::stoi(lit.substr(i + 1, 4), nullptr, 16));
      i += 4;
    } else
      out += e;
  }
  return out;
}

std::vector<ReportOutput> ReportOutputs(const std::string& report) {
  std::vector<ReportOutput> outs;
  for (const auto& x : JsonArrayField(report, "outputs")) {
    ReportOutput o;
    size_t b = x.find("\"bytes\":\"");
    if (b != std::string::npos) {
      size_t e = b + 9;
      while (e < x.size() && x[e] != '"') e += x[e] == '\\' ? 2 : 1;
      o.bytes = JsonStringBytes(x.substr(b + 8, e - b - 7));
    }
    std::string start = JsonField(x, "start"), replica = JsonField(x, "from_replica");
    o.start = start.empty() ? 0 : std::stoull(start);
    o.replica = replica.empty() ? -1 : std::stoi(replica);
    o.note = JsonStringBytes("\"" + JsonField(x, "note") + "\"");
    o.kept = JsonField(x, "kept") == "true";
    outs.push_back(std::move(o));
  }
  return outs;
}

// A state report's state_agreed_index, for people.
std::string StateAgreed(const std::string& index) {
  return index.empty() || index == "0"
             ? "no earlier check is known to have agreed (since this leader leads)"
             : "last agreed with the reference's at entry " + index + " (an earlier check)";
}

// A time in ms since the epoch, local as `divergence list` shows it ("?"
// when malformed).
static std::string UnixMsText(const std::string& ms) {
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(ms.data(), ms.data() + ms.size(), v);
  if (ec != std::errc() || end != ms.data() + ms.size() || v == 0) return "?";
  time_t secs = static_cast<time_t>(v / 1000);
  struct tm t;
  localtime_r(&secs, &t);
  char out[40];
  strftime(out, sizeof out, "%Y-%m-%d %H:%M:%S", &t);
  return out;
}

void PrintReport(const std::string& r) {
  auto f = [&](const char* k) { return JsonField(r, k); };
  printf("divergence %s: %s\n", f("id").c_str(), f("status").c_str());
  printf("  kind        %s\n", f("kind") == "state"
                                   ? "state: the answers to a state check's probe differed"
                                   : "output: the replies to a client differed");
  printf("  found by    leader %s, %s\n", f("leader").c_str(),
         f("leader_diverged") == "true" ? "which is itself the divergent replica"
                                        : ("replica " + f("replica") + " diverged").c_str());
  std::vector<std::string> agreeing = JsonArrayField(r, "agreeing");
  std::string ag;
  for (const auto& a : agreeing) ag += (ag.empty() ? "" : ", ") + a;
  printf("  agreeing    %s\n", ag.empty() ? "(no other replica had reported there)" : ag.c_str());
  printf("  connection  %s, output differs at or before byte %s (last agreeing check: byte %s)\n",
         f("connection").c_str(), f("offset").c_str(), f("agreed_offset").c_str());
  size_t lw = r.find("\"log_window\":{");
  std::string window = lw == std::string::npos ? "" : r.substr(lw, r.find('}', lw) - lw + 1);
  printf("  log window  entries %s..%s (%s inputs of all connections)\n",
         JsonField(window, "from").c_str(), JsonField(window, "to").c_str(),
         JsonField(window, "inputs").c_str());
  if (f("kind") == "state")
    printf("  state       %s\n", StateAgreed(f("state_agreed_index")).c_str());
  if (f("leader_diverged") == "true" && f("new_leader") != "-1" && !f("new_leader").empty())
    printf("  new leader  replica %s, %s ms after the verdict\n", f("new_leader").c_str(),
           f("new_leader_ms").c_str());
  printf("  repair      %s: %s%s%s\n", f("how").c_str(), f("action").c_str(),
         f("error").empty() ? "" : "; error: ", f("error").c_str());
  if (!f("hint").empty()) printf("  hint        %s\n", f("hint").c_str());
  if (f("status") == "recurring")
    printf("  recurring   found %s time(s), the last at %s\n", f("recurrences").c_str(),
           UnixMsText(f("recurred_unix_ms")).c_str());
  if (f("status") == "repaired" || f("status") == "failed")
    printf("              restored checkpoint %s in %s ms; in sync again after %s ms\n",
           f("restored_index").c_str(), f("restore_ms").c_str(), f("total_ms").c_str());
  printf("  inputs of the connection in the window (the last ones):\n");
  std::vector<std::string> inputs = JsonArrayField(r, "connection_inputs");
  if (inputs.empty()) printf("    (none in the log window)\n");
  for (const auto& in : inputs) printf("    %s\n", JsonStringBytes(in).c_str());  // described
  long long diff = std::stoll(f("first_difference").empty() ? "-1" : f("first_difference"));
  printf("  outputs%s:\n",
         diff >= 0 ? (" (first different byte: " + std::to_string(diff) + ", marked >>)").c_str()
                   : "");
  for (const ReportOutput& o : ReportOutputs(r)) {
    printf("    replica %d (%s):\n", o.replica, o.note.c_str());
    if (!o.kept) continue;
    // Around the difference: 160 bytes before, 160 after.
    uint64_t end = o.start + o.bytes.size();
    uint64_t at = diff >= 0 ? static_cast<uint64_t>(diff) : end;
    uint64_t lo = at > o.start + 160 ? at - 160 : o.start;
    uint64_t hi = std::min<uint64_t>(end, at + 160);
    std::string before = lo < at && at <= end ? o.bytes.substr(lo - o.start, at - lo) : "";
    std::string after = at < hi ? o.bytes.substr(at - o.start, hi - at) : "";
    printf("      [byte %llu] %s%s%s\n", static_cast<unsigned long long>(lo),
           EscapeBytes(before).c_str(), diff >= 0 ? " >>" : "", EscapeBytes(after).c_str());
  }
  std::string stack = JsonStringBytes("\"" + f("stack") + "\""), indented;
  for (char c : stack)
    indented += c == '\n' ? std::string("\n                ") : std::string(1, c);
  printf("  stack       %s\n", indented.c_str());
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

std::string ReportHtml(const std::string& r) {
  auto f = [&](const char* k) { return JsonStringBytes("\"" + JsonField(r, k) + "\""); };
  std::string id = f("id");
  long long diff = f("first_difference").empty() ? -1 : std::stoll(f("first_difference"));
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
  std::string agreeing;
  for (const auto& a : JsonArrayField(r, "agreeing"))
    agreeing += (agreeing.empty() ? "" : ", ") + a;
  row("divergent replica",
      f("leader_diverged") == "true"
          ? "the leader, replica " + f("replica")
          : "replica " + f("replica") + " (leader: replica " + f("leader") + ")");
  row("agreeing with the reference",
      agreeing.empty() ? "no other replica had reported there" : "replicas " + agreeing);
  row("kind", f("kind") == "state" ? "state (the answers to a state check's probe)"
                                   : "output (the replies to a client)");
  row("connection", f("connection"));
  row("first different byte", diff >= 0 ? std::to_string(diff) : "not in the kept outputs");
  row("checked", "equal up to byte " + f("agreed_offset") + ", different at byte " + f("offset"));
  size_t lw = r.find("\"log_window\":{");
  std::string window = lw == std::string::npos ? "" : r.substr(lw, r.find('}', lw) - lw + 1);
  row("log window", "entries " + JsonField(window, "from") + ".." + JsonField(window, "to") + " (" +
                        JsonField(window, "inputs") + " inputs of all connections)");
  if (f("kind") == "state") row("state", StateAgreed(f("state_agreed_index")));
  if (f("leader_diverged") == "true" && f("new_leader") != "-1" && !f("new_leader").empty())
    row("new leader",
        "replica " + f("new_leader") + ", " + f("new_leader_ms") + " ms after the verdict");
  row("repair",
      f("how") + ": " + f("action") + (f("error").empty() ? "" : "; error: " + f("error")));
  if (f("status") == "repaired" || f("status") == "failed")
    row("took", "restore " + f("restore_ms") + " ms, in sync again after " + f("total_ms") + " ms");
  if (!f("hint").empty()) row("hint", f("hint"));
  if (f("status") == "recurring")
    row("recurring",
        "found " + f("recurrences") + " time(s), the last at " + UnixMsText(f("recurred_unix_ms")));
  if (!f("stack").empty())
    o += "<tr><td>stack at the send</td><td><pre>" + Html(f("stack")) + "</pre></td></tr>\n";
  o += "</table>\n<h2>Inputs of the connection in the window</h2>\n<ul class=\"inputs\">\n";
  for (const auto& in : JsonArrayField(r, "connection_inputs"))
    o += "<li>" + Html(JsonStringBytes(in)) + "</li>\n";
  o += "</ul>\n<h2>Outputs";
  if (diff >= 0) o += " (the first different byte is marked)";
  o += "</h2>\n<div class=\"outs\">\n";
  std::string leader = f("leader"), divergent = f("replica");
  for (const ReportOutput& out : ReportOutputs(r)) {
    std::string cls = std::to_string(out.replica) == leader ? "ref" : "div";
    o += "<div class=\"out " + cls + "\"><h3>replica " + std::to_string(out.replica) +
         (cls == "ref" ? " (leader)" : "") + ": " + Html(out.note) + "</h3>\n<pre>";
    if (out.kept) {
      uint64_t end = out.start + out.bytes.size();
      if (diff >= 0 && static_cast<uint64_t>(diff) >= out.start &&
          static_cast<uint64_t>(diff) < end) {
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
