// divergence_view.h — a divergence report (guard/output/divergence_report.h, as the
// JSON the replicas answer `lockstep divergence` with) for people: the
// terminal text of `divergence show` and a self-contained HTML page
// (`divergence show ID --html FILE`: the replicas' outputs side by side, the
// first different byte marked). Also the few JSON readers the CLI uses on
// those answers (they come from our own encoder: flat, known fields).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep {

// The top-level items of the JSON array that opens at json[open], as texts.
std::vector<std::string> JsonItems(const std::string& json, size_t open);
// The items of the array field `key` (the first one in the text).
std::vector<std::string> JsonArrayField(const std::string& json, const std::string& key);
// A JSON string literal (quotes included) as bytes: \u00XX is one byte.
std::string JsonStringBytes(const std::string& lit);

// One replica's output around the difference, as the report keeps it.
struct ReportOutput {
  int replica = -1;
  std::string note;    // where it came from, or why it is missing
  bool kept = false;   // bytes were captured
  uint64_t start = 0;  // stream offset of bytes[0]
  std::string bytes;
};
std::vector<ReportOutput> ReportOutputs(const std::string& report);

void PrintReport(const std::string& report);  // to stdout
std::string ReportHtml(const std::string& report);

}  // namespace lockstep
