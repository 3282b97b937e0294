// divergence_view.h — a divergence report (guard/output/divergence_report.h, as the
// JSON the replicas answer `lockstep divergence` with) for people: the
// terminal text of `divergence show` and a self-contained HTML page
// (`divergence show ID --html FILE`: the replicas' outputs side by side, the
// first different byte marked). The report comes from another process or
// from disk: a field that is missing or of another type shows as empty,
// never a throw (fuzz/fuzz_json feeds these arbitrary JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "guard/common/json.h"

namespace lockstep {

// One replica's output around the difference, as the report keeps it.
struct ReportOutput {
  int replica = -1;
  std::string note;    // where it came from, or why it is missing
  bool kept = false;   // bytes were captured
  uint64_t start = 0;  // stream offset of bytes[0]
  std::string bytes;
};
std::vector<ReportOutput> ReportOutputs(const Json& report);

std::string ReportText(const Json& report);  // `divergence show`
std::string ReportHtml(const Json& report);  // `divergence show --html`

}  // namespace lockstep
