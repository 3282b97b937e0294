// output_guard.cc — see output_guard.h.
#include "guard/output/output_guard.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "consensus/assert.h"
#include "guard/common/json.h"
#include "guard/server/log_input.h"

namespace lockstep {

namespace {
constexpr size_t kPointsPerPass = 65536;
constexpr size_t kConnsTracked = 16384;
constexpr size_t kInputsShown = 16;
constexpr size_t kInputBytesShown = 200;
constexpr uint64_t kWindowScanMax = 100000;  // log entries scanned for a report's inputs
constexpr uint64_t kWindowWithoutAgreement = 1000;

std::string ConnName(const ConnKey& k) {
  return BallotString(k.ballot) + "/" + std::to_string(k.no);
}
}  // namespace

OutputGuard::OutputGuard(const ClusterConfig& config, int id, Replica& core,
                         ServerPipeline& pipeline, const ReplicaLog& log, SendFn send)
    : cfg_(config),
      id_(id),
      n_(static_cast<int>(config.replicas.size())),
      core_(core),
      pipeline_(pipeline),
      log_(log),
      send_(std::move(send)),
      reports_dir_(config.replicas[id].dir + "/divergences") {
  next_report_ = NextReportNumber(reports_dir_, id_);
}

void OutputGuard::Step(uint64_t now) {
  // What belonged to another ballot or role goes: a new leader judges
  // afresh (its points start now), a backup reports to the new leader.
  bool leading = core_.role() == Role::kLeader;
  if (core_.promised() != ballot_ || leading != leading_) {
    // Repairs ordered as leader whose results never came: the backup may
    // still finish one, but answers only the leader of the ballot that
    // ordered it. Their reports are closed as interrupted (not left
    // "repairing" for good); the new leader checks the output afresh and
    // reports again what still differs.
    for (auto& [id, repair] : repairs_) {
      if (repair.how == RepairHow::kDescribe) continue;  // no repair: it stays "recurring"
      DivergenceReport& r = repair.report;
      r.status = "interrupted";
      r.error = "this replica stopped leading before replica " + std::to_string(r.replica) +
                " answered the repair order; the new leader checks its output afresh";
      Save(r);
      log_("REPAIR %s interrupted: %s", r.id.c_str(), r.error.c_str());
    }
    ballot_ = core_.promised();
    leading_ = leading;
    checker_.reset();
    repairs_.clear();
    repairs_done_.clear();
    recurring_.clear();
    closed_.clear();
    state_agreed_.clear();
    conns_.clear();
    outgoing_.clear();
    if (leading_) checker_ = std::make_unique<OutputChecker>(n_, id_);
    checked_members_ = 0;  // SetMembers below, on this very step
    checked_voters_ = 0;
  }
  // A restored server sends again what followed its checkpoint.
  if (pipeline_.server_id() != server_id_) {
    server_id_ = pipeline_.server_id();
    conns_.clear();
    // Under repair, what was held back came from the replaced server (a
    // transfer replaces it after a while): that is not this replica's
    // output any more.
    if (repair_) outgoing_.clear();
  }
  if (self_) SelfRepairStep(now);
  if (leading_) {
    // The configuration the log holds now (a member added or removed):
    // whose output is checked and waited for, and the majority that outvotes.
    const Membership& ms = core_.membership();
    uint32_t members = ms.voters | ms.learners;
    if (members != checked_members_ || ms.VoterCount() != checked_voters_) {
      checked_members_ = members;
      checked_voters_ = ms.VoterCount();
      checker_->SetMembers(members, checked_voters_);
      n_ = std::max(n_, 32 - __builtin_clz(members | (1u << id_)));
    }
    LeaderStep(now);
  } else {
    BackupStep(now);
  }
}

void OutputGuard::OnPeerFrame(int from, FrameKind kind, std::string_view body, uint64_t now) {
  switch (kind) {
    case FrameKind::kOutputReport: {
      OutputReport report;
      if (!DecodeOutputReport(body, &report)) {
        log_("malformed output report from replica %d ignored", from);
        return;
      }
      if (!leading_ || !checker_ || report.ballot != ballot_) return;  // for another leader
      // A backup that restarted does not answer the repair it was under.
      uint64_t& seen = reporter_pid_[from];
      if (seen && seen != report.daemon_pid) {
        for (auto it = repairs_.begin(); it != repairs_.end();) {
          if (it->second.report.replica != from) {
            ++it;
            continue;
          }
          if (it->second.how == RepairHow::kDescribe) {  // no repair under way: no verdict
            it = repairs_.erase(it);
            continue;
          }
          DivergenceReport& r = it->second.report;
          r.status = "failed";
          r.error = "replica " + std::to_string(from) + " restarted during the repair";
          Save(r);
          log_("REPAIR %s FAILED: %s", r.id.c_str(), r.error.c_str());
          repairs_failed_++;
          checker_->Resume(from);
          last_repair_.erase(from);
          it = repairs_.erase(it);
        }
      }
      if (seen && seen != report.daemon_pid) {
        // A restarted replica is checked and repaired afresh, a recurring
        // divergence too (its profile may have been fixed meanwhile).
        repairs_done_.erase(from);
        if (auto rec = recurring_.find(from); rec != recurring_.end()) {
          log_("replica %d restarted: its recurring divergence %s is checked afresh", from,
               rec->second.report.id.c_str());
          recurring_.erase(rec);
          checker_->Resume(from);
        }
      }
      seen = report.daemon_pid;
      for (const OutputPoint& p : report.points) checker_->OnBackupPoint(from, p, now);
      return;
    }
    case FrameKind::kRepairOrder: {
      RepairOrder order;
      if (!DecodeRepairOrder(body, &order)) {
        log_("malformed repair order from replica %d ignored", from);
        return;
      }
      OnRepairOrder(from, order, now);
      return;
    }
    case FrameKind::kRepairResult: {
      RepairResult result;
      if (!DecodeRepairResult(body, &result)) {
        log_("malformed repair result from replica %d ignored", from);
        return;
      }
      if (!repairs_.count(result.id))
        log_("repair result %s from replica %d: no such repair under way here", result.id.c_str(),
             from);
      OnRepairResult(from, result, now);
      return;
    }
    default: return;
  }
}

// ---------------------------------------------------------------- backup

void OutputGuard::BackupStep(uint64_t now) {
  OutputPoint p;
  uint32_t flags = 0;
  ServerPipeline::OutputSource source;
  for (size_t n = 0; n < kPointsPerPass && pipeline_.PollOutput(&p, &flags, &source); n++) {
    bool ends = (flags & (LS_OUT_SHUT | LS_OUT_CLOSED)) != 0;
    p.ended = ends;
    if (p.mark || ends) {
      outgoing_.push_back(p);
      if (ends) {
        conns_.erase(p.key);
        continue;
      }
    }
    ConnOut& c = conns_[p.key];
    c.latest = p;
    c.source = source;
    if (p.mark) {
      c.sent_offset = p.offset;
      c.sent_us = now;
    } else if (now - c.sent_us >= kSampleUs && p.offset > c.sent_offset) {
      // The first output after a quiet spell goes at once (a reply to a
      // lone request is checked within a pass, not at the next sample);
      // a busy connection is sampled below, at most every kSampleUs.
      outgoing_.push_back(p);
      c.sent_offset = p.offset;
      c.sent_us = now;
    }
    while (conns_.size() > kConnsTracked) conns_.erase(conns_.begin());  // the oldest ballot's
  }
  // The newest point of every connection that moved: a connection that
  // never reaches a mark is checked too. Read from its window: this
  // replica's shim publishes few of a busy connection's records.
  if (now >= next_sample_us_) {
    next_sample_us_ = now + kSampleUs;
    for (auto& [key, c] : conns_) {
      OutputPoint newest = c.latest;
      if (pipeline_.LatestOutput(c.source, &newest) && newest.offset > c.latest.offset)
        c.latest = newest;
      if (c.latest.offset <= c.sent_offset) continue;
      outgoing_.push_back(c.latest);
      c.sent_offset = c.latest.offset;
      c.sent_us = now;
    }
  }
  RepairStep(now);
  SendPoints(now);
}

void OutputGuard::SendPoints(uint64_t now) {
  (void)now;
  if (outgoing_.empty()) return;
  // A backup under repair holds its digests until it has answered: the
  // leader checks the repaired server's output only after it resumed it.
  if (repair_) {
    if (outgoing_.size() > kMaxHeldPoints)
      outgoing_.erase(outgoing_.begin(), outgoing_.end() - kMaxHeldPoints);
    return;
  }
  int leader = core_.leader();
  if (leader < 0 || leader == id_ || core_.role() != Role::kBackup) {
    outgoing_.clear();
    return;
  }
  for (size_t at = 0; at < outgoing_.size(); at += kMaxPointsPerFrame) {
    OutputReport report;
    report.ballot = ballot_;
    report.daemon_pid = static_cast<uint64_t>(getpid());
    size_t end = std::min(outgoing_.size(), at + kMaxPointsPerFrame);
    report.points.assign(outgoing_.begin() + static_cast<long>(at),
                         outgoing_.begin() + static_cast<long>(end));
    if (send_(leader, FrameKind::kOutputReport, EncodeOutputReport(report)))
      points_sent_ += report.points.size();
  }
  outgoing_.clear();  // not connected: a skipped check, never a wrong one
}

void OutputGuard::OnRepairOrder(int from, const RepairOrder& order, uint64_t now) {
  if (leading_ || order.ballot != core_.promised() || from != BallotLeader(order.ballot)) {
    log_("repair order %s from replica %d ignored: it does not lead ballot %s", order.id.c_str(),
         from, BallotString(core_.promised()).c_str());
    return;
  }
  if (order.how == RepairHow::kDescribe) {
    // Nothing to change: the leader wants this server's side of a
    // divergence that recurs, for its report.
    RepairResult described;
    described.id = order.id;
    described.ok = true;
    described.action = "its server was left as it is";
    FillWindow(order.key, &described);
    log_(
        "DIVERGENCE %s: the leader finds this replica's output on connection %s different at "
        "byte %lu again, where repairs do not hold; no repair (the report shows its output)",
        order.id.c_str(), ConnName(order.key).c_str(), (unsigned long)order.offset);
    send_(from, FrameKind::kRepairResult, EncodeRepairResult(described));
    return;
  }
  if (repair_) {
    RepairResult busy;
    busy.id = order.id;
    busy.error = "repair " + repair_->order.id + " is still under way";
    send_(from, FrameKind::kRepairResult, EncodeRepairResult(busy));
    return;
  }
  Repair rep;
  rep.order = order;
  rep.from = from;
  rep.started_us = now;
  rep.target = core_.commit_index();
  rep.result.id = order.id;
  FillWindow(order.key, &rep.result);  // before the repair replaces the server
  log_(
      "REPAIR %s: the leader found this replica's output on connection %s different at byte %lu: "
      "%s",
      order.id.c_str(), ConnName(order.key).c_str(), (unsigned long)order.offset,
      order.how == RepairHow::kRollback ? "rolling the server back" : "taking a peer's checkpoint");
  // A replica whose server is known to be wrong must not lead meanwhile (a
  // leader's dump for this very repair once stalled it long enough for the
  // divergent backup to win an election, and the repair was lost). Bounded
  // by the repair's own deadline: should every other replica be under
  // repair too, one of them leads again once its repair gives up.
  core_.HoldCandidacy(now + kRepairTimeoutUs);
  repair_hold_ = true;
  StartRepair(std::move(rep), now);
}

// Its server's own output at the place, for the leader's report.
void OutputGuard::FillWindow(const ConnKey& key, RepairResult* result) const {
  ShimChannel::OutputWindow w;
  if (!pipeline_.RecentOutput(key, &w)) return;
  result->have_window = true;
  result->window_start = w.start;
  result->window = w.bytes;
  result->sends = pipeline_.DescribeSends(w);
}

void OutputGuard::StartRepair(Repair rep, uint64_t now) {
  const RepairOrder& order = rep.order;
  if (order.how == RepairHow::kRollback) {
    uint64_t restored = 0;
    bool afresh = false;
    std::string err;
    if (pipeline_.RollBack(order.max_index, &restored, &afresh, &err)) {
      rep.result.restored_index = restored;
      rep.result.restore_us = NowUs() - now;
      rep.result.action = !afresh ? "rolled back to its checkpoint " + std::to_string(restored) +
                                        " and replayed the log from entry " +
                                        std::to_string(restored + 1)
                                  : "started its server afresh (no checkpoint yet) and "
                                    "replayed the whole log";
    } else if (order.agreeing.empty()) {
      // No peer to ask: the leader decides what next (its own checkpoint).
      log_("REPAIR %s: cannot roll back (%s), and no replica agrees with the leader",
           order.id.c_str(), err.c_str());
      rep.result.action = "could not roll back";
      rep.result.error = err;
    } else {
      log_("REPAIR %s: cannot roll back (%s): fetching a checkpoint from a peer instead",
           order.id.c_str(), err.c_str());
      rep.result.action = "could not roll back (" + err + "), so ";
      pipeline_.StartRepairTransfer(order.agreeing, order.min_index);
      rep.transferring = true;
    }
  } else {
    pipeline_.StartRepairTransfer(order.agreeing, order.min_index);
    rep.transferring = true;
  }
  repair_ = std::move(rep);
  // What the replaced server sent is no longer this replica's output.
  outgoing_.clear();
  conns_.clear();
}

void OutputGuard::RepairStep(uint64_t now) {
  if (!repair_) return;
  Repair& rep = *repair_;
  if (rep.transferring) {
    switch (pipeline_.repair_transfer()) {
      case ServerPipeline::RepairTransfer::kRunning: break;
      case ServerPipeline::RepairTransfer::kDone: {
        uint64_t index = pipeline_.repair_transfer_index();
        rep.transferring = false;
        rep.result.restored_index = index;
        rep.result.restore_us = now - rep.started_us;
        rep.result.action += "took checkpoint " + std::to_string(index) +
                             " from a peer and replayed the log from entry " +
                             std::to_string(index + 1);
        pipeline_.ClearRepairTransfer();
        break;
      }
      case ServerPipeline::RepairTransfer::kFailed:
      case ServerPipeline::RepairTransfer::kNone:
        rep.result.action += "tried to take a peer's checkpoint";
        rep.result.error =
            "no peer's checkpoint could be restored: " + pipeline_.repair_transfer_error();
        rep.transferring = false;
        pipeline_.ClearRepairTransfer();
        rep.target = 0;  // answer now
        break;
    }
  }
  bool failed = !rep.result.error.empty();
  bool applied = !rep.transferring && !failed && pipeline_.applied() >= rep.target;
  if (applied && !rep.marked) {
    rep.handed = pipeline_.ReplayHanded();
    rep.marked = true;
  }
  bool in_sync = applied && pipeline_.ReplayReadPast(rep.handed);
  bool late = now - rep.started_us > kRepairTimeoutUs;
  if (!in_sync && !failed && !late) return;
  if (late && !in_sync && !failed)
    rep.result.error =
        "not back in sync within " + std::to_string(kRepairTimeoutUs / 1000000) + " s";
  rep.result.ok = rep.result.error.empty();
  rep.result.total_us = now - rep.started_us;
  log_("REPAIR %s %s in %.1f ms: %s%s%s", rep.order.id.c_str(), rep.result.ok ? "done" : "FAILED",
       rep.result.total_us / 1000.0, rep.result.action.c_str(),
       rep.result.error.empty() ? "" : "; ", rep.result.error.c_str());
  if (repair_hold_) {  // its server is as right as the others' now (or the repair gave up)
    core_.HoldCandidacy(0);
    repair_hold_ = false;
  }
  if (rep.self) {
    FinishSelfRepair(rep.result, now);
  } else if (core_.role() != Role::kBackup || core_.promised() != rep.order.ballot) {
    log_("REPAIR %s: the leader changed meanwhile; the result is not sent", rep.order.id.c_str());
  } else if (!send_(rep.from, FrameKind::kRepairResult, EncodeRepairResult(rep.result))) {
    log_("REPAIR %s: cannot send the result to replica %d (not connected)", rep.order.id.c_str(),
         rep.from);
  }
  repair_.reset();
}

// ---------------------------------------------------------------- leader

void OutputGuard::LeaderStep(uint64_t now) {
  OutputPoint p;
  uint32_t flags = 0;
  for (size_t n = 0; n < kPointsPerPass && pipeline_.PollOutput(&p, &flags); n++) {
    checker_->OnLeaderPoint(p);
    if (flags & LS_OUT_CLOSED) closed_.push_back({now, p.key, pipeline_.IsStateProbe(p.key)});
  }
  while (!closed_.empty() && now - closed_.front().when_us > kForgetClosedUs) {
    const ClosedConn& c = closed_.front();
    for (int r = 0; r < n_ && c.state_probe; r++)
      if (uint64_t at = checker_->AgreedToEnd(r, c.key))
        state_agreed_[r] = std::max(state_agreed_[r], at);
    checker_->ForgetConn(c.key);
    closed_.pop_front();
  }
  for (const lockstep::Divergence& d : checker_->Poll(now)) OnDivergence(d, now);
  for (auto& [replica, rec] : recurring_) {
    if (now < rec.resume_us || !checker_->suspended(replica)) continue;
    bool asked = false;  // its describe order is still out
    for (const auto& [id, repair] : repairs_) asked |= repair.report.replica == replica;
    if (asked) continue;
    rec.resume_us = UINT64_MAX;
    checker_->Resume(replica);
    log_(
        "checks of replica %d resume after %.0f s (divergence %s recurs there: found again, it "
        "is counted in that report)",
        replica, rec.pause_us / 1e6, rec.report.id.c_str());
  }
  for (auto it = repairs_.begin(); it != repairs_.end();) {
    if (now - it->second.ordered_us < kRepairTimeoutUs + 10000000) {
      ++it;
      continue;
    }
    if (it->second.how == RepairHow::kDescribe) {  // the report goes without that side
      log_("divergence %s: replica %d never described its output", it->first.c_str(),
           it->second.report.replica);
      it = repairs_.erase(it);
      continue;
    }
    DivergenceReport& r = it->second.report;
    r.status = "failed";
    r.error = "replica " + std::to_string(r.replica) + " never answered the repair order";
    Save(r);
    log_("REPAIR %s FAILED: %s", r.id.c_str(), r.error.c_str());
    repairs_failed_++;
    checker_->Resume(r.replica);
    it = repairs_.erase(it);
  }
}

OutputExcerpt OutputGuard::OwnExcerpt(const ConnKey& key) const {
  OutputExcerpt x;
  x.replica = id_;
  ShimChannel::OutputWindow w;
  if (pipeline_.RecentOutput(key, &w)) {
    x.have = true;
    x.start = w.start;
    x.bytes = w.bytes;
    x.sends = pipeline_.DescribeSends(w);
    x.note = "taken when the divergence was found";
  } else {
    x.note = "no longer kept (the connection's window was reused)";
  }
  return x;
}

void OutputGuard::FillInputs(DivergenceReport* r) const {
  uint64_t to = std::min(r->window_to, core_.commit_index());
  uint64_t from = r->window_from + 1;
  if (to > kWindowScanMax && from < to - kWindowScanMax) from = to - kWindowScanMax;
  from = std::max(from, core_.first_index());
  std::deque<std::string> shown;
  bool data = false, accepted = false;
  std::string last_command;
  for (uint64_t i = from; i <= to && i >= from; i++) {
    const Entry* e = core_.At(i);
    if (!e || e->type != EntryType::kInput) continue;
    Input in;
    if (!DecodeInput(e->payload, &in)) continue;
    r->inputs_in_window++;
    if (in.kind == LS_SUB_TICK || in.key != r->key) continue;  // a tick's key names no conn
    shown.push_back("entry " + std::to_string(i) + ": " + DescribeInput(in, kInputBytesShown));
    if (shown.size() > kInputsShown) shown.pop_front();
    if (in.kind == LS_SUB_ACCEPT) accepted = true;
    if (in.kind == LS_SUB_DATA) {
      data = true;
      last_command = RequestCommand(in.bytes);
    }
  }
  r->inputs.assign(shown.begin(), shown.end());
  // A window that begins after the connection's first input has seen data
  // before it (its first check agreed there). So has one whose connection
  // was accepted before the entries scanned: the log truncated below them
  // (a checkpoint) or the scan bounded; only an accept seen with no data
  // after it shows that the difference came before the first input (the
  // greeting hint). Without it, redis TIME whose input had been truncated
  // away was hinted as a greeting (test_recurring, once in a full run).
  bool data_before = data || r->agreed_offset > 0 || !accepted;
  r->hint = DivergenceHint(cfg_.server, r->kind, data_before, last_command);
}

uint64_t OutputGuard::StateAgreedIndex(int replica) const {
  auto known = state_agreed_.find(replica);
  uint64_t at = known == state_agreed_.end() ? 0 : known->second;
  for (const ClosedConn& c : closed_)
    if (c.state_probe) at = std::max(at, checker_->AgreedToEnd(replica, c.key));
  return at;
}

static uint64_t UnixMs() {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000 + static_cast<uint64_t>(t.tv_nsec) / 1000000;
}

void OutputGuard::Save(DivergenceReport& r) {
  if (r.status != "repairing" && !r.done_unix_ms) r.done_unix_ms = UnixMs();
  std::string err;
  if (!WriteReport(reports_dir_, r, &err))
    log_("cannot save divergence report %s: %s", r.id.c_str(), err.c_str());
}

void OutputGuard::OnDivergence(const lockstep::Divergence& d, uint64_t now) {
  // Handed over earlier in this pass: the next leader judges afresh.
  if (core_.role() != Role::kLeader) return;
  divergences_++;
  DivergenceReport r;
  r.id = std::to_string(id_) + "-" + std::to_string(next_report_++);
  r.found_unix_ms = UnixMs();
  r.time_unix = r.found_unix_ms / 1000;
  r.leader = id_;
  r.replica = d.replica;
  r.leader_diverged = d.replica == id_;
  r.agreeing = d.agreeing;
  r.key = d.key;
  r.kind = pipeline_.IsStateProbe(d.key) ? "state" : "output";
  r.offset = d.offset;
  r.agreed_offset = d.agreed_offset;
  r.leader_digest = d.leader_digest;
  r.replica_digest = d.replica_digest;
  r.window_to = d.differ_applied;
  r.window_from = d.agreed_applied ? d.agreed_applied
                  : d.differ_applied > kWindowWithoutAgreement
                      ? d.differ_applied - kWindowWithoutAgreement
                      : 0;
  // A state check's probe is a connection of its own each time: where the
  // state last agreed is the newest earlier check this replica answered
  // alike, and the log window runs from there.
  if (r.kind == "state") {
    r.state_agreed_index = StateAgreedIndex(d.replica);
    if (r.state_agreed_index && r.state_agreed_index < d.differ_applied)
      r.window_from = r.state_agreed_index;
  }
  FillInputs(&r);
  r.outputs.push_back(OwnExcerpt(d.key));
  if (r.leader_diverged) {
    HandOverDivergent(d, std::move(r), now);
    return;
  }
  if (recurring_.count(d.replica)) {
    OnRecurrence(d, std::move(r), nullptr, now);
    return;
  }
  if (const RepairDone* last = Recurs(d, r, now)) {
    OnRecurrence(d, std::move(r), last, now);
    return;
  }
  // Diverging again at or before the place of the last repair: the cause
  // is in this replica's checkpoint (or the replica itself), not in what
  // followed it.
  RepairHow how = RepairHow::kRollback;
  auto last = last_repair_.find(d.replica);
  bool again =
      last != last_repair_.end() && last->second.key == d.key && d.offset <= last->second.offset;
  // Giving up: the replica stays suspended in the checker, its report says why.
  std::string give_up;
  if (again && last->second.how == RepairHow::kTransfer) {
    give_up =
        "diverged again at the same place after taking a peer's checkpoint: left out of the "
        "checks until it is restarted";
  } else if (again && d.agreeing.empty()) {
    // A rollback replayed the same inputs and the output differs at the
    // same place again, and no replica's output agrees with the leader's
    // there: no backup's checkpoint holds a server that would send what the
    // leader's sent. The leader's server did something a replay does not
    // repeat (randomness or the clock without the profile's prevention, or
    // a fault of its own), and only its own state is right: the backup
    // takes a checkpoint of the leader's server.
    std::string why_not;
    if (pipeline_.StartLeaderCheckpoint(now, &why_not)) {
      RepairFromLeader(std::move(r), "it diverged again at the same place after a rollback", now);
      return;
    }
    give_up =
        "diverged again at the same place after a rollback, and no replica's output agrees "
        "with the leader's there, so no backup has a checkpoint to give it, and the leader "
        "cannot give its own (" +
        why_not +
        "): the leader's server did something a replay does not repeat (randomness or the wall "
        "clock: the app profile's same_random and same_clock prevent those). Left out of the "
        "checks until it is restarted";
  }
  if (!give_up.empty()) {
    r.status = "failed";
    r.how = "none";
    r.action = give_up;
    Save(r);
    repairs_failed_++;
    log_("DIVERGENCE %s: replica %d's output on connection %s differs at byte %lu again; %s",
         r.id.c_str(), d.replica, ConnName(d.key).c_str(), (unsigned long)d.offset,
         r.action.c_str());
    return;
  }
  if (again) how = RepairHow::kTransfer;
  // A state that differs, with no check known to have agreed since this
  // leader leads: a checkpoint from before the probe may hold the
  // difference already, so the state of a replica that agrees is taken.
  if (r.kind == "state" && !r.state_agreed_index && !d.agreeing.empty()) how = RepairHow::kTransfer;
  last_repair_[d.replica] = LastRepair{d.key, d.offset, how};
  RepairOrder order = OrderFor(r, how);
  order.max_index = d.agreed_applied       ? d.agreed_applied
                    : d.differ_applied > 0 ? d.differ_applied - 1
                                           : 0;
  if (r.state_agreed_index && r.state_agreed_index < order.max_index)
    order.max_index = r.state_agreed_index;  // the state is known right there
  order.agreeing = d.agreeing;
  // A rollback that fails falls back to a transfer too (StartRepair).
  order.min_index = d.differ_applied;
  r.how = RepairHowName(how);
  log_(
      "DIVERGENCE %s: replica %d's output on connection %s differs at byte %lu (log entries "
      "%lu..%lu; judged %.1f ms after the first differing digest arrived%s); ordering a %s%s",
      r.id.c_str(), d.replica, ConnName(d.key).c_str(), (unsigned long)d.offset,
      (unsigned long)r.window_from, (unsigned long)r.window_to, d.disputed_us / 1000.0,
      d.length_differs
          ? ("; its stream ends at byte " + std::to_string(d.replica_offset) + " instead").c_str()
          : "",
      r.how.c_str(), again ? " (it diverged at the same place after a rollback)" : "");
  SendRepairOrder(std::move(r), order, now);
}

RepairOrder OutputGuard::OrderFor(const DivergenceReport& r, RepairHow how) const {
  RepairOrder order;
  order.ballot = ballot_;
  order.id = r.id;
  order.how = how;
  order.key = r.key;
  order.offset = r.offset;
  return order;
}

void OutputGuard::SendRepairOrder(DivergenceReport r, const RepairOrder& order, uint64_t now,
                                  std::string leader_action) {
  if (!send_(r.replica, FrameKind::kRepairOrder, EncodeRepairOrder(order))) {
    r.status = "failed";
    r.error = "the repair order could not be sent (no connection to replica " +
              std::to_string(r.replica) + ")";
    Save(r);
    repairs_failed_++;
    checker_->Resume(r.replica);  // found again later, ordered again
    return;
  }
  Save(r);
  std::string id = r.id;  // (the right side of = is evaluated first: r is moved from)
  repairs_[id] = LeaderRepair{std::move(r), order.how, now, std::move(leader_action)};
}

// ---------------------------------------------------------------- a divergence that recurs

// A replica repaired well that differs again soon after is not suffering
// faults one by one: its server does something a replay does not repeat
// (TIME without same_clock, a salt), and every repair would be followed by
// the next difference, each one closing the leader's clients' connections
// when it takes the leader's checkpoint. Judged so after a transfer (the
// strongest repair: an agreeing replica's or the leader's own state) or
// after kRepairsBeforeRecurring repairs, within kRecurWithinUs, when the
// report names a likely cause of that kind (its hint: a prevention the
// profile leaves off, a reply that may differ by nature). Not by the hint's
// equality: the same cause gets another hint when the window holds no
// input of the connection (a new connection's first reply reads as a
// greeting).
const OutputGuard::RepairDone* OutputGuard::Recurs(const lockstep::Divergence& d,
                                                   const DivergenceReport& r, uint64_t now) {
  auto it = repairs_done_.find(d.replica);
  if (it == repairs_done_.end() || r.hint.empty()) return nullptr;
  std::deque<RepairDone>& done = it->second;
  while (!done.empty() && now - done.front().done_us > kRecurWithinUs) done.pop_front();
  bool transfer = false;
  for (const RepairDone& x : done) transfer |= x.how == RepairHow::kTransfer;
  if (!transfer && done.size() < kRepairsBeforeRecurring) return nullptr;
  return &done.back();
}

// One report for a recurring divergence (status "recurring"), with the
// replica's side asked for (a describe order changes nothing there); the
// replica's checks pause, then resume, and each later difference is counted
// in that report, with longer pauses. No repair is ordered: the leader's
// clients are served on while the report says what to change.
void OutputGuard::OnRecurrence(const lockstep::Divergence& d, DivergenceReport r,
                               const RepairDone* last, uint64_t now) {
  recurrences_++;
  auto known = recurring_.find(d.replica);
  if (known != recurring_.end()) {
    Recurring& rec = known->second;
    rec.report.recurrences++;
    rec.report.recurred_unix_ms = r.found_unix_ms;
    Save(rec.report);
    rec.pause_us = std::min(rec.pause_us * 2, kRecurLongestPauseUs);
    rec.resume_us = now + rec.pause_us;
    log_(
        "DIVERGENCE %s recurs: replica %d's output on connection %s differs at byte %lu "
        "(%lu times now); its checks pause %.0f s",
        rec.report.id.c_str(), d.replica, ConnName(d.key).c_str(), (unsigned long)d.offset,
        (unsigned long)rec.report.recurrences, rec.pause_us / 1e6);
    return;
  }
  char after[64];
  snprintf(after, sizeof after, "%.1f", (now - last->done_us) / 1e6);
  r.status = "recurring";
  r.how = "none";
  r.recurrences = 1;
  r.recurred_unix_ms = r.found_unix_ms;
  r.action = std::string("found again ") + after + " s after its repair " + last->id + " (" +
             RepairHowName(last->how) +
             "): the likely cause is the server's own nondeterminism (see the hint), or a fault of "
             "this replica, that repairs do not cure. Repairs of replica " +
             std::to_string(d.replica) + " stop: its server is left as it is, checked again " +
             std::to_string(kRecurFirstPauseUs / 1000000) +
             " s on, and each time it differs it is counted here. Change the app profile as the "
             "hint says, then restart the replica to have it repaired and checked as before";
  log_(
      "DIVERGENCE %s: replica %d's output on connection %s differs at byte %lu again, %s s after "
      "its repair %s: recurring, no more repairs of it (%s)",
      r.id.c_str(), d.replica, ConnName(d.key).c_str(), (unsigned long)d.offset, after,
      last->id.c_str(), r.hint.c_str());
  RepairOrder order = OrderFor(r, RepairHow::kDescribe);
  Save(r);
  recurring_[d.replica] = Recurring{r, now + kRecurFirstPauseUs, kRecurFirstPauseUs};
  std::string id = r.id;
  if (send_(d.replica, FrameKind::kRepairOrder, EncodeRepairOrder(order)))
    repairs_[id] = LeaderRepair{std::move(r), RepairHow::kDescribe, now, ""};
}

// ---------------------------------------------------------------- from the leader's own server

// The backup's repair is a transfer from the leader, of the checkpoint the
// leader takes of its own server (ServerPipeline::StartLeaderCheckpoint,
// asked for just before): ordered at once, so that the backup stops taking
// checkpoints of its wrong server (and truncating its log past the
// leader's), and its fetch is answered once the leader's is committed.
void OutputGuard::RepairFromLeader(DivergenceReport r, const std::string& why, uint64_t now) {
  last_repair_[r.replica] = LastRepair{r.key, r.offset, RepairHow::kTransfer};
  r.how = RepairHowName(RepairHow::kTransfer);
  r.status = "repairing";
  r.error.clear();
  r.action = why +
             ", and no replica's output agrees with the leader's there: the leader checkpoints "
             "its own server (closing its clients' connections through the log, as a change of "
             "leader does) for it to take, and ";
  log_(
      "DIVERGENCE %s: replica %d's output on connection %s differs at byte %lu (%s), and no "
      "replica agrees with this leader there: it takes a checkpoint of this leader's server",
      r.id.c_str(), r.replica, ConnName(r.key).c_str(), (unsigned long)r.offset, why.c_str());
  RepairOrder order = OrderFor(r, RepairHow::kTransfer);
  order.agreeing = {id_};
  order.min_index = r.window_to;  // the leader's checkpoint of now, not an older one it keeps
  std::string leader_action = r.action;
  SendRepairOrder(std::move(r), order, now, std::move(leader_action));
}

// ---------------------------------------------------------------- a divergent leader

// This leader's output differs where a majority of backups agree with each
// other: its server is the wrong one, and its clients have been reading
// from it. It hands leadership over to one of those backups (Replica::
// HandOver: phase 1 under the next ballot, so nothing committed is lost),
// which closes this leader's connections as any new leader does, and
// stands for no election until it is repaired. The repair starts at once:
// as a backup it takes a checkpoint from a replica that agreed (never a
// rollback: its own checkpoints were taken while it was a backup, but
// nothing says when its server went wrong) and replays the log after it.
// Its server is replaced, which closes the clients' connections to it.
void OutputGuard::HandOverDivergent(const lockstep::Divergence& d, DivergenceReport r,
                                    uint64_t now) {
  LS_ASSERT(d.replica == id_ && leading_ && core_.role() == Role::kLeader,
            "hand-over by replica %d (role %s) for replica %d's divergence", id_,
            RoleName(core_.role()), d.replica);
  // The successor: a backup that agreed, with a live stream, the furthest
  // along (the shortest phase 1).
  int successor = d.agreeing.empty() ? -1 : core_.FurthestReadyPeer(d.agreeing);
  for (int b : d.agreeing)
    if (successor < 0 && b >= 0 && b < n_ && b != id_) successor = b;
  Ballot ballot = core_.promised();
  uint64_t commit = core_.commit_index();
  r.how = "step down";
  if (successor < 0 || !core_.HandOver(now, successor, kSelfRepairHoldUs)) {
    r.status = "not repaired";
    r.error = "no backup that agreed to hand leadership over to";
    Save(r);
    repairs_failed_++;
    log_("DIVERGENCE %s: THIS LEADER's output on connection %s differs at byte %lu; %s",
         r.id.c_str(), ConnName(d.key).c_str(), (unsigned long)d.offset, r.error.c_str());
    return;
  }
  r.action =
      "this leader's output differed from backups that agree with each other: it handed "
      "leadership over to replica " +
      std::to_string(successor) + ", and ";
  Save(r);
  log_(
      "DIVERGENCE %s: THIS LEADER's output on connection %s differs at byte %lu from replicas "
      "that agree with each other: handed leadership over to replica %d; standing for no "
      "election until this server is repaired from a peer's checkpoint",
      r.id.c_str(), ConnName(d.key).c_str(), (unsigned long)d.offset, successor);
  SelfRepair s;
  s.report = std::move(r);
  s.agreeing = d.agreeing;
  s.successor = successor;
  s.ballot = ballot;
  s.found_us = now;
  if (repair_) {  // an order it took as a backup and never finished
    log_("REPAIR %s abandoned: this replica's own repair comes first", repair_->order.id.c_str());
    repair_.reset();
  }
  Repair rep;
  rep.self = true;
  rep.started_us = now;
  rep.target = commit;  // in sync once it executed what it had committed as leader
  rep.order.ballot = ballot;
  rep.order.id = s.report.id;
  rep.order.how = RepairHow::kTransfer;
  rep.order.key = d.key;
  rep.order.offset = d.offset;
  // The successor last: a backup takes a fresh checkpoint when asked for a
  // newer one than it has; a leader never pauses its server for one.
  for (int b : d.agreeing)
    if (b != successor) rep.order.agreeing.push_back(b);
  rep.order.agreeing.push_back(successor);
  rep.result.id = s.report.id;
  self_ = std::move(s);
  StartRepair(std::move(rep), now);
}

void OutputGuard::SelfRepairStep(uint64_t now) {
  SelfRepair& s = *self_;
  DivergenceReport& r = s.report;
  int l = core_.leader();
  if (r.new_leader < 0 && l >= 0 && l != id_ && core_.promised() > s.ballot) {
    r.new_leader = l;
    r.new_leader_ms = static_cast<double>(now - s.found_us) / 1000.0;
    log_(
        "DIVERGENCE %s: replica %d leads ballot %s, %.1f ms after this leader found itself "
        "divergent",
        r.id.c_str(), l, BallotString(core_.promised()).c_str(), r.new_leader_ms);
    Save(r);
  }
  // The repaired server replays the connection's inputs and sends what the
  // replicas that agreed sent there: the report shows it next to what this
  // leader's clients got.
  if (s.repaired_us && !s.excerpt_done) {
    ShimChannel::OutputWindow w;
    if (pipeline_.RecentOutput(r.key, &w) && w.start + w.bytes.size() >= r.offset) {
      OutputExcerpt x;
      x.replica = id_;
      x.have = true;
      x.start = w.start;
      x.bytes = w.bytes;
      x.note = "this replica's server after its repair (what the replicas that agreed sent)";
      r.outputs.push_back(std::move(x));
      r.first_difference =
          FirstDifference(r.outputs.front(), r.outputs.back(), r.agreed_offset, r.offset);
      r.stack = StackAt(r.outputs.front(), r.first_difference);  // the leader's own
      s.excerpt_done = true;
      Save(r);
    } else if (now - s.repaired_us > kExcerptWaitUs) {
      s.excerpt_done = true;
    }
  }
  bool repairing = repair_ && repair_->self;
  bool late = now - s.found_us > kSelfRepairHoldUs;
  bool done = !repairing && r.new_leader >= 0 && (!s.repaired_us || s.excerpt_done);
  if (done || (!repairing && late)) self_.reset();
}

void OutputGuard::FinishSelfRepair(const RepairResult& result, uint64_t now) {
  SelfRepair& s = *self_;
  DivergenceReport& r = s.report;
  r.status = result.ok ? "repaired" : "failed";
  r.action += result.action;
  if (!result.ok && result.action.empty()) r.action += "its repair failed";
  r.error = result.error;
  r.restored_index = result.restored_index;
  r.restore_ms = result.restore_us / 1000.0;
  r.total_ms = static_cast<double>(now - s.found_us) / 1000.0;
  Save(r);
  if (result.ok) {
    s.repaired_us = now;
    repairs_ok_++;
    core_.HoldCandidacy(0);  // a server as right as the others': it may lead again
  } else {
    repairs_failed_++;  // the hold runs out on its own
  }
  log_("REPAIR %s of this former leader %s in %.1f ms after the verdict%s%s", r.id.c_str(),
       result.ok ? "done" : "FAILED", r.total_ms,
       result.ok ? "; it may stand for election again" : ": ", result.ok ? "" : r.error.c_str());
}

void OutputGuard::AddExcerpt(DivergenceReport* r, int from, const RepairResult& result,
                             const char* taken) {
  OutputExcerpt x;
  x.replica = from;
  x.have = result.have_window;
  x.start = result.window_start;
  x.bytes = result.window;
  x.sends = result.sends;
  x.note = x.have ? taken : "no longer kept";
  r->outputs.push_back(x);
  r->first_difference = FirstDifference(r->outputs.front(), x, r->agreed_offset, r->offset);
  r->stack = StackAt(x, r->first_difference);
}

void OutputGuard::OnRepairResult(int from, const RepairResult& result, uint64_t now) {
  auto it = repairs_.find(result.id);
  if (it == repairs_.end() || it->second.report.replica != from) return;
  DivergenceReport& r = it->second.report;
  if (it->second.how == RepairHow::kDescribe) {
    auto rec = recurring_.find(from);
    if (rec != recurring_.end() && rec->second.report.id == r.id) {
      AddExcerpt(&rec->second.report, from, result, "taken when the leader asked for it");
      Save(rec->second.report);
    }
    repairs_.erase(it);
    return;
  }
  AddExcerpt(&r, from, result, "taken when the repair order arrived");
  // A rollback that could not be made (no checkpoint of its own old enough),
  // where no backup agrees with the leader to give one: only the leader's
  // own server can.
  std::string why_not;
  if (!result.ok && it->second.how == RepairHow::kRollback && r.agreeing.empty() &&
      result.restored_index == 0 && pipeline_.StartLeaderCheckpoint(now, &why_not)) {
    DivergenceReport again = std::move(r);
    repairs_.erase(it);
    RepairFromLeader(std::move(again), "it could not roll back (" + result.error + ")", now);
    return;
  }
  r.status = result.ok ? "repaired" : "failed";
  r.action = it->second.leader_action + result.action;
  r.error = result.error;
  r.restored_index = result.restored_index;
  r.restore_ms = result.restore_us / 1000.0;
  r.total_ms = result.total_us / 1000.0;
  Save(r);
  log_("REPAIR %s of replica %d %s in %.1f ms: %s%s%s", r.id.c_str(), from,
       result.ok ? "done" : "FAILED", r.total_ms, r.action.c_str(), r.error.empty() ? "" : "; ",
       r.error.c_str());
  if (result.ok) {
    repairs_ok_++;
    repairs_done_[from].push_back(RepairDone{now, it->second.how, r.id});
  } else {
    repairs_failed_++;
  }
  checker_->Resume(from);  // checked again; a failed repair is found and escalated
  repairs_.erase(it);
}

uint64_t OutputGuard::LogNeededFrom() const {
  if (!leading_ || !checker_) return 0;
  uint64_t oldest = checker_->OldestOpenIndex();
  for (const auto& [id, r] : repairs_) oldest = std::min(oldest, r.report.window_from);
  return oldest == UINT64_MAX ? 0 : oldest + 1;
}

// ---------------------------------------------------------------- status

Json OutputGuard::StatusJson() const {
  size_t reports = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(reports_dir_, ec))
    if (e.path().extension() == ".json") reports++;
  Json ends_settled = Json::array(), state_agreed = Json::array(), suspended = Json::array();
  Json recurring = Json::array();
  for (const auto& [replica, rec] : recurring_) recurring.push_back(replica);
  for (int r = 0; r < n_; r++) {
    ends_settled.push_back(checker_ ? checker_->ends_settled(r) : 0);
    // By replica: where its state last agreed (0: not known).
    state_agreed.push_back(checker_ ? StateAgreedIndex(r) : 0);
    if (checker_ && checker_->suspended(r)) suspended.push_back(r);
  }
  return Json{{"role", leading_ ? "judge" : "reporter"},
              {"checks", checker_ ? checker_->checks() : 0},
              {"unchecked", checker_ ? checker_->unchecked() : 0},
              {"past_cut", checker_ ? checker_->past_cut() : 0},
              {"open", checker_ ? checker_->open() : 0},
              {"ends_settled", std::move(ends_settled)},
              {"state_agreed", std::move(state_agreed)},
              {"unnamed", pipeline_.unnamed_outputs()},
              {"points_sent", points_sent_},
              {"divergences", divergences_},
              {"reports", reports},
              {"repairs", repairs_ok_},
              {"repairs_failed", repairs_failed_},
              {"recurrences", recurrences_},
              {"recurring", std::move(recurring)},
              {"repairing", repair_ || !repairs_.empty()},
              {"suspended", std::move(suspended)}};
}

std::string OutputGuard::Divergence(const DivergenceRequest& req) const {
  return DivergenceAnswer(reports_dir_, req);
}

}  // namespace lockstep
