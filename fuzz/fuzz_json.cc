// fuzz_json.cc — libFuzzer target for the readers of JSON another process
// wrote: a daemon's status and checkpoint list as the CLI and the peers read
// them (guard/net/answers.h), a divergence report file as a daemon reads it
// from disk (ReportFromText) and a `divergence list` answer as the CLI
// shows it (ReportText, ReportHtml, guard/output/divergence_view.h). The
// first byte picks the reader. Whatever the bytes, nothing may throw (an
// exception out of here is a crash to libFuzzer), and JSON that parses is
// written again by JsonText to text that reads back the same.
#include "fuzz/fuzz_util.h"
#include "guard/common/json.h"
#include "guard/net/answers.h"
#include "guard/output/divergence_report.h"
#include "guard/output/divergence_view.h"

namespace lockstep {
namespace {

// JsonText of a parsed value is JSON, and writing what it reads as is stable.
void Rewrites(const Json& j) {
  std::string text = JsonText(j), error;
  Json again;
  FUZZ_CHECK(ParseJson(text, &again, &error));
  FUZZ_CHECK(JsonText(again) == text);
}

void Show(const Json& report) {
  std::string text = ReportText(report), html = ReportHtml(report);
  FUZZ_CHECK(html.find("</html>") != std::string::npos);
  (void)text;
  for (const ReportOutput& o : ReportOutputs(report)) FUZZ_CHECK(o.replica >= -1);
}

void Status(std::string_view in) {
  DaemonStatus s;
  std::string error;
  if (!ParseDaemonStatus(in, &s, &error)) {
    FUZZ_CHECK(!error.empty());
    return;
  }
  FUZZ_CHECK(s.checkpoint.is_null() || s.checkpoint.is_object());
  FUZZ_CHECK(s.output.is_null() || s.output.is_object());
  FUZZ_CHECK(s.state_checks.is_null() || s.state_checks.is_object());
  FUZZ_CHECK(s.server_pid >= 0);
  Rewrites(s.checkpoint);
}

void CheckpointList(std::string_view in) {
  std::vector<CheckpointListItem> items;
  std::string error;
  if (!ParseCheckpointList(in, &items, &error)) {
    FUZZ_CHECK(!error.empty() && items.empty());
    return;
  }
  for (const CheckpointListItem& c : items) {
    FUZZ_CHECK(c.json.is_object() && c.replica >= -1);
    Rewrites(c.json);
  }
}

void ReportFile(std::string_view in) {
  Json r = ReportFromText(in, "0-1");
  FUZZ_CHECK(r.is_object());
  Rewrites(r);
  Show(r);
}

void ListAnswer(std::string_view in) {
  Json list;
  std::string error;
  if (!ParseJson(in, &list, &error)) return;
  Rewrites(list);
  if (!list.is_array()) return;
  for (const Json& r : list) Show(r);
}

void Bytes(std::string_view in) {
  // Any bytes survive the report's byte fields: written, read, decoded.
  std::string text = JsonText(Json{{"bytes", JsonFromBytes(in)}}), error;
  Json back;
  FUZZ_CHECK(ParseJson(text, &back, &error));
  FUZZ_CHECK(BytesFromJson(JsonStr(back, "bytes")) == in);
  // And any bytes as text (an error message) are written, never thrown.
  FUZZ_CHECK(ParseJson(JsonText(Json(std::string(in))), &back, &error));
}

}  // namespace
}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: Status(in); break;
    case 1: CheckpointList(in); break;
    case 2: ReportFile(in); break;
    case 3: ListAnswer(in); break;
    case 4: Bytes(in); break;
  }
  return 0;
}
