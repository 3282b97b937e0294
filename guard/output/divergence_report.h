// divergence_report.h — what a divergence report holds, as JSON for people
// and programs, and where reports live: one file per divergence in the
// directory divergences/ of the replica that led when it was found. The
// leader writes a report when it judges a replica divergent and again when
// the repair is over; `lockstep divergence list|show` read them through
// the daemons (OutputGuard::Divergence).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "guard/common/config.h"
#include "guard/common/conn_key.h"
#include "guard/common/json.h"
#include "guard/common/output_point.h"
#include "guard/net/wire.h"  // DivergenceRequest

namespace lockstep {

// One replica's latest output on the connection, around the difference.
struct OutputExcerpt {
  int replica = -1;
  bool have = false;             // false: the bytes were no longer kept
  uint64_t start = 0;            // stream offset of bytes[0]
  std::string bytes;             // at most the shim's window (4 KiB)
  std::string note;              // why not have, or how it was taken
  std::vector<SendStack> sends;  // the last sends' stacks (not in the JSON)
};

struct DivergenceReport {
  std::string id;  // "<leader>-<n>"
  uint64_t time_unix = 0;
  // When the leader found it, and when its repair ended (0: not yet), in
  // ms since the epoch: for measuring detection and repair from outside.
  uint64_t found_unix_ms = 0, done_unix_ms = 0;
  int leader = -1;   // the replica that judged (and led)
  int replica = -1;  // the divergent one
  bool leader_diverged = false;
  // "output": the server's replies to a client differed; "state": its
  // answers to a state check's probe (guard/server/state_check.h) did, so
  // its state differs where no reply has shown it yet.
  std::string kind = "output";
  std::vector<int> agreeing;  // replicas that agreed with the reference there
  ConnKey key;
  uint64_t offset = 0;         // the checked stream offset where the digests differed
  uint64_t agreed_offset = 0;  // the last offset checked equal on that connection (0: none)
  uint64_t leader_digest = 0, replica_digest = 0;
  uint64_t window_from = 0,
           window_to = 0;  // log indices: the last agreeing check .. the differing one
  // Kind "state": the log index up to which the replica's state last agreed
  // with the reference's (an earlier check's probe answered alike to its
  // end; 0: none known to the leader that found it). Its repair rolls back
  // to a checkpoint at or before it, or takes an agreeing replica's state.
  uint64_t state_agreed_index = 0;
  std::vector<std::string> inputs;     // that connection's inputs in the window, described
  uint64_t inputs_in_window = 0;       // all connections' inputs there
  std::vector<OutputExcerpt> outputs;  // the reference's and the divergent replica's
  // The first byte offset where the two excerpts differ (-1: not within
  // what both kept).
  int64_t first_difference = -1;
  // The repair.
  // repairing | repaired | failed | not repaired | interrupted (the leader that
  // ordered the repair stopped leading before its result came) | recurring
  // (it came back soon after its repairs, with a likely cause the hint
  // names: the server's own nondeterminism, which no repair mends; none is
  // ordered any more)
  std::string status = "repairing";
  std::string how;     // rollback | transfer | step down | none
  std::string action;  // what was done, for people
  std::string error;
  uint64_t restored_index = 0;
  double restore_ms = 0, total_ms = 0;
  // A divergent leader (how "step down"): the replica that leads after it
  // handed over, and when this replica first knew it, from the verdict.
  int new_leader = -1;
  double new_leader_ms = 0;
  std::string stack = "not captured";  // the divergent server's stack at the send (StackAt)
  // The app profile option that would prevent it, if the cause is the
  // server's own nondeterminism (DivergenceHint); "" when none applies.
  std::string hint;
  // Status "recurring": how often it was found again since this report
  // (each time its replica's checks resumed), and when last.
  uint64_t recurrences = 0;
  uint64_t recurred_unix_ms = 0;

  std::string ToJson() const;
};

// The first offset (a stream offset) at which two excerpts of the same
// stream differ within [from, to); -1 when they agree there or do not both
// cover it.
int64_t FirstDifference(const OutputExcerpt& a, const OutputExcerpt& b, uint64_t from, uint64_t to);
// For the report: the stack of x's replica's server at the send that sent
// stream byte `at` (the first difference), or at the newest send before it;
// or why there is none.
std::string StackAt(const OutputExcerpt& x, int64_t at);

// What a report's reader may change when the divergence is the server's own
// nondeterminism (it comes back at the same place after a repair): the app
// profile's option that prevents its likely cause, from what is off in
// `server` and what the connection's inputs in the window were (any DATA at
// all, and the command of the last one). "" when nothing applies.
std::string DivergenceHint(const ClusterConfig::ServerConfig& server, const std::string& kind,
                           bool data_in_window, const std::string& last_command);
// The command a request starts with: a RESP array's first bulk string, or a
// text line's first word (printable, at most 32 bytes); "" otherwise.
std::string RequestCommand(const std::string& request);

// Reports in dir (replica-N/divergences): Write is atomic (a temporary
// file, fsync, rename). NextNumber: one past the highest report number
// for leader `leader` in dir.
bool WriteReport(const std::string& dir, const DivergenceReport& report, std::string* error);
uint64_t NextReportNumber(const std::string& dir, int leader);
// A report file's text as JSON; a damaged one (not a JSON object) as a
// stand-in that says so: {"id": id, "status": "unreadable", "error": why}.
Json ReportFromText(std::string_view text, const std::string& id);
// Every report in dir, oldest first.
std::vector<Json> ReadReports(const std::string& dir);
// The answer to a divergence request from the reports in dir: a daemon's
// (OutputGuard::Divergence), and the CLI's own read of a replica whose
// daemon is down (reports are read after the fact, on a stopped cluster).
// list: a JSON array; show: the report, "" when dir has no such one.
std::string DivergenceAnswer(const std::string& dir, const DivergenceRequest& req);

}  // namespace lockstep
