// state_check.h — the leader's state checks (issue 29): a replica whose
// server's state drifted while its replies stayed the same (a byte of a
// stored value flipped, a random draw stored) answers nothing differently
// until, maybe, a later read shows it. So every `state_check_every_s`
// seconds in which clients' inputs were committed, the leader runs the
// profile's `state_probe` (a command given the server's {host} and {port},
// e.g. `redis-cli ... DEBUG DIGEST`) against its own server.
//
// The probe is a client of the leader's server like any other: its request
// is agreed in the log, every backup's server executes it at the same
// position of the log (on its replay connection), and what each one
// answers is compared by output checking (guard/output/): a replica whose
// state differs answers the probe differently and is reported and repaired
// like any divergence, at the check's position. Through the log, a probe
// needs no pause of anyone's server to find it at rest at one index, and a
// probe that moves the server's state a little (redis's DEBUG DIGEST steps
// an incremental rehash) moves every replica's alike.
//
// A probe may check a slice of the state each time (redis's: the next 1000
// keys of a SCAN): it exits with kProbeSliceExit (3) after a slice that
// leaves the pass over the state unfinished, 0 after the one that ends it
// (an unsliced probe always exits 0). Checks are due while a pass is
// unfinished, and while clients' inputs moved since the start of the last
// finished pass: a value written once and never again is checked by a pass
// that began after it, whichever slice it landed in.
//
// The probe runs in a thread of its own (fork+exec, its output read, a
// deadline); Step, on the daemon's loop, starts and collects it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "guard/common/config.h"
#include "guard/common/json.h"

namespace lockstep {

class StateChecker {
 public:
  using LogFn = std::function<void(const std::string&)>;
  StateChecker(const ClusterConfig& config, const ReplicaConfig& me, LogFn log);
  ~StateChecker();  // a probe in flight is killed and waited for
  StateChecker(const StateChecker&) = delete;
  StateChecker& operator=(const StateChecker&) = delete;

  // A probe's exit status after a slice that leaves its pass unfinished.
  static constexpr int kProbeSliceExit = 3;

  // Each loop pass: collects a probe that ended; starts one when due (this
  // replica serves its clients, the interval passed since the last one
  // began, and either the last probe failed, the pass over the state is
  // unfinished, or
  // client_inputs, the count of clients' requests (DATA inputs) this replica
  // committed, no probe's own, moved since the last finished pass began:
  // what clients sent while a pass ran is checked by the next).
  void Step(uint64_t now_us, bool serving, uint64_t client_inputs);
  // {"every_s":..,"checks":..,"passes":..,"failed":..,"digest":"..","ms":..,"error":"..",
  //  "last_failure":".."}: error, the last probe's failure (empty once one succeeded);
  //  last_failure, the latest failure's reason, kept.
  Json StatusJson() const;
  // The local port of the probe's connection to the server (0: none yet):
  // an ACCEPT from it is the probe's, not a client's.
  uint16_t probe_port() const { return probe_port_.load(); }

 private:
  void Run(std::vector<std::string> argv);  // the probe's thread

  const ClusterConfig& cfg_;
  const ReplicaConfig& me_;
  LogFn log_;
  uint64_t every_us_;
  uint64_t last_start_us_ = 0;
  // client_inputs when the pass now under way (or the last finished one)
  // began; mid_pass_: the last probe left its pass unfinished.
  uint64_t inputs_at_pass_start_ = 0;
  bool mid_pass_ = false;
  bool retry_ = false;  // the last probe failed
  bool started_once_ = false;

  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<pid_t> probe_pid_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint16_t> probe_port_{0};
  // Written by the thread before done_, read after it.
  bool result_ok_ = false;
  bool result_slice_ = false;  // exited kProbeSliceExit: the pass goes on
  std::string result_output_, result_error_;
  uint64_t result_us_ = 0;

  uint64_t checks_ = 0, passes_ = 0, failed_ = 0;
  std::string digest_, error_, last_failure_;
  uint64_t last_ms_ = 0;
};

}  // namespace lockstep
