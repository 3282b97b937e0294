// sim_run.cc — the randomized run of the simulator (RunSimulation, see
// sim.h): drives a SimCluster with a seed's schedule of proposals, crashes,
// partitions, held one-sided writes, pauses and truncations (RandomRun: one
// step function per kind of fault, run in a fixed order), with
// SimOptions::membership also membership changes, and replays a failing
// seed with its trace on.
#include <algorithm>
#include <cstring>

#include "consensus/sim.h"
#include "consensus/sim_util.h"

namespace lockstep {

using namespace sim_util;

// ---------------------------------------------------------------- the randomized run

namespace {

// Next time of a Poisson-ish process with the given mean (0: never).
uint64_t NextAt(std::mt19937_64& rng, uint64_t now, uint64_t mean) {
  if (mean == 0) return UINT64_MAX;
  return now + 1 + Uniform(rng, 0, 2 * mean);
}

std::string MakePayload(std::mt19937_64& rng, const SimOptions& opt, uint64_t n, uint64_t limit) {
  std::string p = "s" + std::to_string(opt.seed) + "-" + std::to_string(n);
  double x = Unit(rng);
  size_t pad;
  if (x < opt.huge_payload_rate) {
    pad = limit > p.size() + 64 ? limit - p.size() - Uniform(rng, 0, 64) : 0;
  } else if (x < opt.huge_payload_rate + opt.large_payload_rate) {
    pad = Uniform(rng, 1000, 8000);
  } else {
    pad = Uniform(rng, 0, 40);
  }
  p.push_back(':');
  for (size_t i = 0; i < pad; i++) p.push_back(static_cast<char>('a' + (n + i) % 26));
  return p;
}

// The run's digest (SimResult::digest): what the cluster ended with, read
// only (it draws nothing from the PRNG and changes nothing).
uint32_t Digest(SimCluster& c) {
  auto add = [](uint32_t crc, uint64_t v) { return Crc32c(crc, &v, sizeof v); };
  uint32_t crc = add(add(0, c.now()), c.steps());
  for (int r = 0; r < c.size(); r++) {
    const Replica* x = c.replica(r);
    crc = add(crc, x ? x->commit_index() : 0);
    if (!x) continue;
    for (uint64_t i = x->first_index(); i <= std::min(x->commit_index(), x->last_index()); i++) {
      const Entry* e = x->At(i);
      if (!e) continue;
      crc = add(add(add(crc, e->index), e->ballot), static_cast<uint64_t>(e->type));
      crc = Crc32c(crc, e->payload.data(), e->payload.size());
    }
  }
  return crc;
}

// One randomized run: the faults and the client load of a seed's schedule,
// then the end (everything healed, progress required) and the result. Each
// kind of fault has its own next time and its own step, which does nothing
// unless its time has come; Step runs them in a fixed order, the order in
// which they draw from the PRNG, so that a seed replays bit for bit.
class RandomRun {
 public:
  RandomRun(const SimOptions& opt, bool keep_trace)
      : opt_(opt),
        keep_trace_(keep_trace),
        c_(opt),
        rng_(c_.rng()),
        n_(c_.size()),
        restart_at_(n_, kNever) {
    c_.KeepTrace(keep_trace);
    // The first times, drawn in this order.
    next_propose_ = NextAt(rng_, 0, opt.propose_every_us);
    next_crash_ = opt.faults ? NextAt(rng_, 0, opt.crash_every_us) : kNever;
    next_partition_ = opt.faults ? NextAt(rng_, 0, opt.partition_every_us) : kNever;
    next_pause_ = opt.faults ? NextAt(rng_, 0, opt.pause_every_us) : kNever;
    next_truncate_ = NextAt(rng_, 0, opt.truncate_every_us);
    next_handover_ = opt.faults ? NextAt(rng_, 0, opt.handover_every_us) : kNever;
    next_hold_ = opt.faults ? NextAt(rng_, 0, opt.hold_one_sided_every_us) : kNever;
    next_unreachable_ = opt.faults ? NextAt(rng_, 0, opt.spurious_unreachable_every_us) : kNever;
    next_transfer_ =
        opt.faults && opt.transfer_every_us ? NextAt(rng_, 0, opt.transfer_every_us) : kNever;
    // Drawn last, and only when on: a run without changes replays as before.
    next_membership_ = opt.membership ? NextAt(rng_, 0, opt.membership_every_us) : kNever;
  }

  SimResult Run() {
    RunFaults();
    if (!c_.failed()) HealEverything();
    if (!c_.failed()) RequireProgress();
    if (!c_.failed()) c_.CheckAcknowledged();
    return Result();
  }

 private:
  static constexpr uint64_t kNever = UINT64_MAX;

  // Until the end of the schedule (or a violation): from one fault's or
  // proposal's time to the next.
  void RunFaults() {
    while (!c_.failed()) {
      uint64_t t = NextTime();
      c_.RunUntilTime(t);
      if (c_.failed() || t >= opt_.duration_us) break;
      Step(t);
    }
  }

  uint64_t NextTime() const {
    uint64_t t =
        std::min({opt_.duration_us, next_propose_, next_crash_, next_partition_, next_pause_,
                  next_truncate_, next_check_, next_unreachable_, next_handover_, next_hold_,
                  next_transfer_, heal_at_, resume_at_, next_membership_});
    for (uint64_t x : restart_at_) t = std::min(t, x);
    return t;
  }

  // Whatever is due at t, in the order the PRNG is drawn from.
  void Step(uint64_t t) {
    RestartCrashed(t);
    HealPartition(t);
    ResumeAfterTakeover(t);
    ResumePaused(t);
    if (t == next_check_) next_check_ = t + 1000;
    Crash(t);
    CutLinks(t);
    Pause(t);
    HoldOneSided(t);
    SpuriousUnreachable(t);
    HandOver(t);
    Transfer(t);
    Truncate(t);
    Propose(t);
    ChangeMembership(t);
  }

  // Replicas down or paused (of those that take part).
  int Down() const {
    int d = 0;
    for (int r = 0; r < n_; r++) d += c_.present(r) && (!c_.up(r) || c_.paused(r));
    return d;
  }
  // Replicas that may be down at once.
  int Tolerate() const { return opt_.membership ? c_.Tolerate() : (n_ - 1) / 2; }
  // Any replica that takes part (without membership changes: any of n_,
  // drawn as before).
  int AnyReplica() {
    if (!opt_.membership) return static_cast<int>(Uniform(rng_, 0, n_ - 1));
    std::vector<int> present;
    for (int r = 0; r < n_; r++)
      if (c_.present(r)) present.push_back(r);
    return present[Uniform(rng_, 0, present.size() - 1)];
  }

  void RestartCrashed(uint64_t t) {
    for (int r = 0; r < n_; r++) {
      if (restart_at_[r] == t) {
        restart_at_[r] = kNever;
        if (c_.tracing()) c_.Trace("fault: restart r" + std::to_string(r));
        c_.Restart(r);
      }
    }
  }

  void HealPartition(uint64_t t) {
    if (t != heal_at_) return;
    heal_at_ = kNever;
    if (c_.tracing()) c_.Trace("fault: heal");
    c_.Heal();
  }

  // Resume the paused leader a little after another leader took over
  // (checked every ms).
  void ResumeAfterTakeover(uint64_t t) {
    if (paused_ < 0 || t != next_check_ || resume_soon_) return;
    for (int r = 0; r < n_; r++) {
      const Replica* x = c_.replica(r);
      if (r != paused_ && x && x->role() == Role::kLeader && x->promised() > paused_ballot_ &&
          !resume_soon_) {
        resume_at_ = std::min(resume_at_, t + Uniform(rng_, 1, 5000));
        resume_soon_ = true;
      }
    }
  }

  void ResumePaused(uint64_t t) {
    if (paused_ < 0 || t != resume_at_) return;
    if (c_.tracing()) c_.Trace("fault: resume r" + std::to_string(paused_));
    c_.Resume(paused_);
    paused_ = -1;
    resume_at_ = kNever;
  }

  // A replica crashes (the leader at crash_leader_bias), while fewer than a
  // minority are down, and restarts a while later.
  void Crash(uint64_t t) {
    if (t != next_crash_) return;
    next_crash_ = NextAt(rng_, t, opt_.crash_every_us);
    if (Down() >= Tolerate()) return;
    int victim = c_.Leader();
    if (victim < 0 || !Bernoulli(rng_, opt_.crash_leader_bias)) victim = AnyReplica();
    if (!c_.up(victim)) return;
    if (c_.tracing()) c_.Trace("fault: crash r" + std::to_string(victim));
    if (victim == paused_) {
      paused_ = -1;
      resume_at_ = kNever;
    }
    c_.Crash(victim);
    restart_at_[victim] = t + Uniform(rng_, opt_.restart_min_us, opt_.restart_max_us);
  }

  // One direction of one link is cut, or the replicas split in two sides,
  // until heal_at_ (one partition at a time).
  void CutLinks(uint64_t t) {
    if (t != next_partition_) return;
    next_partition_ = NextAt(rng_, t, opt_.partition_every_us);
    if (heal_at_ != kNever) return;
    if (Bernoulli(rng_, 0.3)) {  // one direction of one link
      int a = AnyReplica();
      int b = AnyReplica();
      if (a != b) {
        if (c_.tracing()) c_.Trace(Format("fault: cut r%d -> r%d", a, b));
        c_.SetLink(a, b, false);
      }
    } else {
      std::set<int> side;
      int present = 0;
      for (int r = 0; r < n_; r++) {
        if (!c_.present(r)) continue;
        present++;
        if (rng_() & 1) side.insert(r);
      }
      if (!side.empty() && static_cast<int>(side.size()) < present) {
        std::string s;
        for (int r : side) s += " r" + std::to_string(r);
        if (c_.tracing()) c_.Trace("fault: partition {" + s + " } from the rest");
        c_.Partition(side);
      }
    }
    heal_at_ = t + Uniform(rng_, opt_.partition_min_us, opt_.partition_max_us);
  }

  // Mostly the leader pauses; sometimes anyone (a candidate or backup that
  // stalls with its view of the world, then carries on).
  void Pause(uint64_t t) {
    if (t != next_pause_) return;
    next_pause_ = NextAt(rng_, t, opt_.pause_every_us);
    bool anyone = Bernoulli(rng_, opt_.pause_anyone_rate);
    int target = anyone ? AnyReplica() : c_.Leader();
    if (paused_ >= 0 || target < 0 || !c_.up(target) || Down() >= Tolerate()) return;
    paused_ = target;
    paused_ballot_ = c_.replica(target)->promised();
    if (c_.tracing())
      c_.Trace(Format("fault: pause %s r%d", RoleName(c_.replica(target)->role()), target));
    c_.Pause(target);
    // Usually resumed after a takeover (checked every ms), sometimes
    // before anyone noticed; at the latest after pause_max_us.
    resume_soon_ = anyone || Bernoulli(rng_, 0.2);
    resume_at_ =
        t + (resume_soon_ ? Uniform(rng_, 100, anyone ? 100'000 : 15'000) : opt_.pause_max_us);
  }

  // The one-sided writes of one direction of one link land late, one right
  // after another (TCP retransmitting the transport's connection), while the
  // messages go through.
  void HoldOneSided(uint64_t t) {
    if (t != next_hold_) return;
    next_hold_ = NextAt(rng_, t, opt_.hold_one_sided_every_us);
    int a = AnyReplica();
    int b = AnyReplica();
    uint64_t until = t + Uniform(rng_, 1, opt_.hold_one_sided_max_us);
    if (a == b) return;
    if (c_.tracing()) c_.Trace(Format("fault: hold one-sided writes r%d -> r%d", a, b));
    c_.HoldOneSided(a, b, until);
  }

  // The transport of one replica wrongly reports a live peer unreachable.
  void SpuriousUnreachable(uint64_t t) {
    if (t != next_unreachable_) return;
    next_unreachable_ = NextAt(rng_, t, opt_.spurious_unreachable_every_us);
    int a = AnyReplica();
    int b = AnyReplica();
    if (a != b) c_.NotifyUnreachable(a, b);
  }

  // The leader gives up leading (its server diverged, say) to anyone else: a
  // live backup, or one that is down, cut off or paused.
  void HandOver(uint64_t t) {
    if (t != next_handover_) return;
    next_handover_ = NextAt(rng_, t, opt_.handover_every_us);
    int l = c_.Leader();
    int to = AnyReplica();
    uint64_t hold = Uniform(rng_, 0, opt_.handover_hold_max_us);
    if (l < 0 || to == l) return;
    if (c_.tracing()) c_.Trace(Format("fault: r%d hands over to r%d", l, to));
    c_.HandOver(l, to, hold);
  }

  // An operator moves leadership to anyone else (`lockstep leader move`):
  // the leader stops proposing, waits for the target (which may be down,
  // cut off or paused, and then the transfer times out) and hands over.
  void Transfer(uint64_t t) {
    if (t != next_transfer_) return;
    next_transfer_ = NextAt(rng_, t, opt_.transfer_every_us);
    int l = c_.Leader();
    int to = AnyReplica();
    uint64_t timeout = Uniform(rng_, 0, opt_.transfer_timeout_max_us);
    uint64_t hold = Uniform(rng_, 0, opt_.handover_hold_max_us);
    if (l < 0 || to == l) return;
    if (c_.tracing()) c_.Trace(Format("fault: r%d moves leadership to r%d", l, to));
    c_.TransferLeadership(l, to, timeout, hold);
  }

  // A replica truncates its log. By default below what every replica holds
  // durably as committed, so no replica ever needs a snapshot (checkpoints
  // are the guard's business). With truncate_lagging, below what a majority
  // holds: the others may need a snapshot, which the core cannot give them,
  // but a majority can always go on.
  void Truncate(uint64_t t) {
    if (t != next_truncate_) return;
    next_truncate_ = NextAt(rng_, t, opt_.truncate_every_us);
    // With membership changes, below what the committed configuration's
    // voters hold: a learner that lags then installs a checkpoint.
    std::vector<uint64_t> held;
    for (int r = 0; r < n_; r++) {
      if (opt_.membership && !c_.committed_membership().IsVoter(r)) continue;
      const DurableState& d = c_.durable(r);
      uint64_t last = d.first_index + d.slots.size() - 1;
      held.push_back(std::min(d.commit_index, last) + 1);
    }
    std::sort(held.rbegin(), held.rend());
    uint64_t limit = opt_.truncate_lagging ? held[held.size() / 2] : held.back();
    int r = AnyReplica();
    const Replica* x = c_.replica(r);
    if (x && limit > x->first_index()) {
      uint64_t below = Uniform(rng_, x->first_index() + 1, limit);
      c_.TruncateBelow(r, below);
    }
  }

  // The client load: the leader, if there is one, proposes an input (one in
  // sixteen an output check) and the cluster tracks what it acknowledges.
  void Propose(uint64_t t) {
    if (t != next_propose_) return;
    next_propose_ = NextAt(rng_, t, opt_.propose_every_us);
    int l = c_.Leader();
    if (l < 0) return;
    const Replica* x = c_.replica(l);
    std::string p = MakePayload(rng_, opt_, proposals_++, x->max_payload());
    EntryType type = (rng_() % 16 == 0) ? EntryType::kOutputCheck : EntryType::kInput;
    ProposeResult pr = c_.Propose(l, type, p);
    if (pr.ok) c_.Track(l, pr.index, type, p);
  }

  // Membership changes, one attempt at a time, between `replicas` voters
  // and one more (7 replicas: 6 and 7): add a learner (a new node with the next fresh id), promote
  // it once the leader takes it (caught up), remove a voter (the leader
  // itself half the time). With membership_bug (the rules off in the core)
  // every attempt makes two changes at once, up to two voters more: two
  // learners added, both promoted, two voters removed.
  void ChangeMembership(uint64_t t) {
    RetireRemoved();
    if (t != next_membership_) return;
    next_membership_ = NextAt(rng_, t, opt_.membership_every_us);
    int l = c_.Leader();
    bool aim_leader = Bernoulli(rng_, 0.5);
    uint64_t pick = rng_();
    if (l < 0) return;
    const int changes = opt_.membership_bug ? 2 : 1;
    // Between `replicas` voters and `changes` more (7 replicas: 6 and 7,
    // as no configuration has more than kMaxVoters).
    const int fewest_voters = std::min(opt_.replicas, kMaxVoters - changes);
    const int most_voters = fewest_voters + changes;
    // What this attempt does, decided once on the configuration it starts from.
    const Membership start = c_.replica(l)->membership();
    MembershipChangeKind kind = start.learners ? MembershipChangeKind::kPromote
                                : start.VoterCount() >= most_voters
                                    ? MembershipChangeKind::kRemove
                                    : MembershipChangeKind::kAddLearner;
    for (int i = 0; i < changes; i++) {
      const Replica* x = c_.replica(l);
      if (!x || x->role() != Role::kLeader) return;
      const Membership& m = x->membership();
      MembershipChange change;
      change.kind = kind;
      if (kind == MembershipChangeKind::kPromote) {
        if (!m.learners) return;
        change.id = __builtin_ctz(m.learners);
      } else if (kind == MembershipChangeKind::kRemove) {
        if (m.VoterCount() <= fewest_voters) return;
        std::vector<int> voters;
        for (int r = 0; r < n_; r++)
          if (m.IsVoter(r) && r != l) voters.push_back(r);
        change.id = aim_leader && m.IsVoter(l) ? l : voters[(pick + i) % voters.size()];
      } else {
        // The lowest id never started: one whose add was lost with its
        // leader stays out (its node idles, in no configuration).
        int id = m.next_id;
        while (id < n_ && c_.incarnation(id) != 0) id++;
        if (id >= n_) return;  // every fresh id used
        change.id = id;
      }
      if (c_.tracing())
        c_.Trace(Format("membership: r%d proposes %s r%d", l, MembershipChangeKindName(change.kind),
                        change.id));
      ProposeResult pr = c_.ProposeMembershipChange(l, change);
      if (!pr.ok) return;
      membership_changes_++;
      if (change.kind == MembershipChangeKind::kAddLearner) c_.AddNode(change.id);
    }
  }

  // A replica the committed configuration no longer holds, after it was in
  // one, stops for good (an operator shuts it down).
  void RetireRemoved() {
    if (!opt_.membership) return;
    const Membership& m = c_.committed_membership();
    for (int r = 0; r < n_; r++) {
      if (!c_.present(r) || m.IsMember(r) || !((c_.ever_committed_members() >> r) & 1)) continue;
      // A removed leader first steps aside (Replica::MaybeStepAsideRemoved).
      if (c_.replica(r) && c_.replica(r)->role() == Role::kLeader) continue;
      if (r == paused_) {
        paused_ = -1;
        resume_at_ = kNever;
      }
      restart_at_[r] = kNever;
      c_.RetireNode(r);
    }
  }

  // The end: heal everything, resume and restart every replica, then quiet.
  // A node added whose change never committed (lost with its leader) is
  // retired: it belongs to no configuration.
  void HealEverything() {
    if (c_.tracing()) c_.Trace("end of faults: heal, resume, restart");
    c_.SetLossy(false);
    c_.Heal();
    for (int r = 0; r < n_; r++) {
      if (!c_.present(r)) continue;
      if (c_.paused(r)) c_.Resume(r);
      if (!c_.up(r)) c_.Restart(r);
    }
    c_.RunFor(opt_.quiet_us);
    RetireRemoved();
  }

  // A new proposal (proposed again if lost with its leader) must commit on
  // every replica (truncate_lagging: a majority) with the same value within
  // progress_timeout_us.
  void RequireProgress() {
    uint64_t deadline = c_.now() + opt_.progress_timeout_us;
    int probe_at = -1;
    uint64_t probe_inc = 0, probe_index = 0;
    std::string probe;
    int probes = 0;
    bool done = false;
    while (!c_.failed() && c_.now() < deadline) {
      c_.RunFor(1000);
      if (probe_at >= 0) {
        const Replica* x = c_.replica(probe_at);
        const Entry* e = x ? x->At(probe_index) : nullptr;
        if (c_.incarnation(probe_at) != probe_inc || !e || e->payload != probe) {
          probe_at = -1;  // lost with its leader; propose again
        } else if (c_.AllCommitted(probe_index) ||
                   (opt_.truncate_lagging && c_.MajorityCommitted(probe_index))) {
          bool all = true;
          for (int r = 0; r < n_; r++) {
            if (!c_.replica(r)) continue;
            const Entry* f = c_.replica(r)->At(probe_index);
            if (f && c_.replica(r)->commit_index() >= probe_index && f->payload != probe)
              all = false;
          }
          if (!all) {
            c_.Fail("probe committed with different values");
            break;
          }
          done = true;
          break;
        }
      }
      if (probe_at < 0) {
        int l = c_.Leader();
        if (l < 0) continue;
        probe = "probe-" + std::to_string(opt_.seed) + "-" + std::to_string(probes++);
        ProposeResult pr = c_.Propose(l, EntryType::kInput, probe);
        if (pr.ok) {
          probe_at = l;
          probe_inc = c_.incarnation(l);
          probe_index = pr.index;
          c_.Track(l, pr.index, EntryType::kInput, probe);
        }
      }
    }
    if (c_.failed() || done) return;
    std::string state;
    for (int r = 0; r < n_; r++) {
      if (!c_.present(r)) continue;
      const Replica* x = c_.replica(r);
      state += Format(" r%d:%s/%s/c%llu/l%llu", r, x ? RoleName(x->role()) : "down",
                      x ? BallotString(x->promised()).c_str() : "-", (U)(x ? x->commit_index() : 0),
                      (U)(x ? x->last_index() : 0));
    }
    c_.Fail(
        Format("progress: no proposal committed on %s replicas within %llums after the "
               "faults healed (probe %s at index %llu;%s)",
               opt_.truncate_lagging ? "a majority of" : "all",
               (U)(opt_.progress_timeout_us / 1000), probe.c_str(), (U)probe_index, state.c_str()));
  }

  SimResult Result() {
    SimResult res;
    res.ok = !c_.failed();
    res.committed = c_.MaxCommitted();
    res.acknowledged = c_.acknowledged();
    res.elections = c_.elections();
    res.lease_checks = c_.lease_checks();
    res.crashes = c_.crashes();
    res.transfers = c_.transfers();
    res.transfers_handed_over = c_.transfers_handed_over();
    res.transfers_timed_out = c_.transfers_timed_out();
    res.membership_changes = membership_changes_;
    res.checkpoints_installed = c_.checkpoints_installed();
    res.final_voters = c_.committed_membership().VoterCount();
    for (const auto& [index, e] : c_.committed())
      res.membership_committed += e.type == EntryType::kConfig;
    res.steps = c_.steps();
    res.digest = Digest(c_);
    res.summary = Format(
        "seed %llu, %d replicas, %llums simulated: %s; committed %llu, acknowledged %llu, "
        "elections %llu, crashes %llu, steps %llu, steps under a lease %llu",
        (U)opt_.seed, opt_.replicas, (U)(c_.now() / 1000), res.ok ? "ok" : "VIOLATION",
        (U)res.committed, (U)res.acknowledged, (U)res.elections, (U)res.crashes, (U)res.steps,
        (U)res.lease_checks);
    if (opt_.membership)
      res.summary += Format(
          "; membership changes %llu proposed, %llu committed, %llu checkpoints installed, "
          "ending with %s",
          (U)res.membership_changes, (U)res.membership_committed, (U)res.checkpoints_installed,
          c_.committed_membership().ToString().c_str());
    if (!res.ok) {
      res.violation = c_.violation();
      if (keep_trace_) res.violation += "\nlast events:\n" + c_.TraceTail();
    }
    return res;
  }

  const SimOptions& opt_;
  const bool keep_trace_;  // a violation's report gets the trace's tail
  SimCluster c_;
  std::mt19937_64& rng_;
  const int n_;
  // The next time of each kind of fault, of the paused leader's check, and
  // of a proposal (kNever: none due).
  uint64_t next_propose_, next_crash_, next_partition_, next_pause_, next_truncate_;
  uint64_t next_handover_, next_hold_, next_unreachable_, next_transfer_;
  uint64_t next_membership_ = kNever;
  uint64_t membership_changes_ = 0;
  uint64_t next_check_ = 1000;
  std::vector<uint64_t> restart_at_;  // by replica: when a crashed one restarts
  uint64_t heal_at_ = kNever;         // when the partition heals
  int paused_ = -1;                   // the paused replica, or -1
  Ballot paused_ballot_ = 0;          // its promise when it paused
  uint64_t resume_at_ = kNever;
  bool resume_soon_ = false;  // resumed at resume_at_, not after a takeover
  uint64_t proposals_ = 0;
};

SimResult RunOnce(const SimOptions& opt, bool keep_trace) {
  return RandomRun(opt, keep_trace).Run();
}

}  // namespace

SimResult RunSimulation(const SimOptions& options) {
  // Tracing costs; a failing run is replayed with the trace on (deterministic).
  bool trace = options.verbose;
  SimResult r = RunOnce(options, trace);
  if (!r.ok && !trace) {
    SimResult again = RunOnce(options, true);
    if (again.violation.compare(0, r.violation.size(), r.violation) != 0) {
      r.violation += "\n(NONDETERMINISM: the replay found: " + again.violation + ")";
    } else {
      r.violation = again.violation;
    }
  }
  return r;
}

}  // namespace lockstep
