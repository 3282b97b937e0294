// sim_run.cc — the randomized run of the simulator (RunSimulation, see
// sim.h): drives a SimCluster with a seed's schedule of proposals, crashes,
// partitions, held one-sided writes, pauses and truncations, and replays a
// failing seed with its trace on.
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

SimResult RunOnce(const SimOptions& opt, bool keep_trace) {
  SimResult res;
  SimCluster c(opt);
  c.KeepTrace(keep_trace);
  std::mt19937_64& rng = c.rng();
  const int n = opt.replicas;
  const int tolerate = (n - 1) / 2;  // replicas that may be down at once
  const uint64_t end = opt.duration_us;
  const uint64_t kNever = UINT64_MAX;

  uint64_t next_propose = NextAt(rng, 0, opt.propose_every_us);
  uint64_t next_crash = opt.faults ? NextAt(rng, 0, opt.crash_every_us) : kNever;
  uint64_t next_partition = opt.faults ? NextAt(rng, 0, opt.partition_every_us) : kNever;
  uint64_t next_pause = opt.faults ? NextAt(rng, 0, opt.pause_every_us) : kNever;
  uint64_t next_truncate = NextAt(rng, 0, opt.truncate_every_us);
  uint64_t next_handover = opt.faults ? NextAt(rng, 0, opt.handover_every_us) : kNever;
  uint64_t next_hold = opt.faults ? NextAt(rng, 0, opt.hold_one_sided_every_us) : kNever;
  uint64_t next_check = 1000;
  uint64_t next_unreachable =
      opt.faults ? NextAt(rng, 0, opt.spurious_unreachable_every_us) : kNever;
  std::vector<uint64_t> restart_at(n, kNever);
  uint64_t heal_at = kNever;
  int paused = -1;
  Ballot paused_ballot = 0;
  uint64_t resume_at = kNever;
  bool resume_soon = false;
  uint64_t proposals = 0;

  auto down = [&] {
    int d = 0;
    for (int r = 0; r < n; r++) d += !c.up(r) || c.paused(r);
    return d;
  };

  while (!c.failed()) {
    uint64_t t =
        std::min({end, next_propose, next_crash, next_partition, next_pause, next_truncate,
                  next_check, next_unreachable, next_handover, next_hold, heal_at, resume_at});
    for (uint64_t x : restart_at) t = std::min(t, x);
    c.RunUntilTime(t);
    if (c.failed() || t >= end) break;
    for (int r = 0; r < n; r++) {
      if (restart_at[r] == t) {
        restart_at[r] = kNever;
        if (c.tracing()) c.Trace("fault: restart r" + std::to_string(r));
        c.Restart(r);
      }
    }
    if (t == heal_at) {
      heal_at = kNever;
      if (c.tracing()) c.Trace("fault: heal");
      c.Heal();
    }
    if (paused >= 0 && t == next_check && !resume_soon) {
      // Resume the paused leader a little after another leader took over.
      for (int r = 0; r < n; r++) {
        const Replica* x = c.replica(r);
        if (r != paused && x && x->role() == Role::kLeader && x->promised() > paused_ballot &&
            !resume_soon) {
          resume_at = std::min(resume_at, t + Uniform(rng, 1, 5000));
          resume_soon = true;
        }
      }
    }
    if (paused >= 0 && t == resume_at) {
      if (c.tracing()) c.Trace("fault: resume r" + std::to_string(paused));
      c.Resume(paused);
      paused = -1;
      resume_at = kNever;
    }
    if (t == next_check) next_check = t + 1000;
    if (t == next_crash) {
      next_crash = NextAt(rng, t, opt.crash_every_us);
      if (down() < tolerate) {
        int victim = c.Leader();
        if (victim < 0 || !Bernoulli(rng, opt.crash_leader_bias)) {
          victim = static_cast<int>(Uniform(rng, 0, n - 1));
        }
        if (c.up(victim)) {
          if (c.tracing()) c.Trace("fault: crash r" + std::to_string(victim));
          if (victim == paused) {
            paused = -1;
            resume_at = kNever;
          }
          c.Crash(victim);
          restart_at[victim] = t + Uniform(rng, opt.restart_min_us, opt.restart_max_us);
        }
      }
    }
    if (t == next_partition) {
      next_partition = NextAt(rng, t, opt.partition_every_us);
      if (heal_at == kNever) {
        if (Bernoulli(rng, 0.3)) {  // one direction of one link
          int a = static_cast<int>(Uniform(rng, 0, n - 1));
          int b = static_cast<int>(Uniform(rng, 0, n - 1));
          if (a != b) {
            if (c.tracing()) c.Trace(Format("fault: cut r%d -> r%d", a, b));
            c.SetLink(a, b, false);
          }
        } else {
          std::set<int> side;
          for (int r = 0; r < n; r++)
            if (rng() & 1) side.insert(r);
          if (!side.empty() && static_cast<int>(side.size()) < n) {
            std::string s;
            for (int r : side) s += " r" + std::to_string(r);
            if (c.tracing()) c.Trace("fault: partition {" + s + " } from the rest");
            c.Partition(side);
          }
        }
        heal_at = t + Uniform(rng, opt.partition_min_us, opt.partition_max_us);
      }
    }
    if (t == next_pause) {
      next_pause = NextAt(rng, t, opt.pause_every_us);
      // Mostly the leader; sometimes anyone (a candidate or backup that
      // stalls with its view of the world, then carries on).
      bool anyone = Bernoulli(rng, opt.pause_anyone_rate);
      int target = anyone ? static_cast<int>(Uniform(rng, 0, n - 1)) : c.Leader();
      if (paused < 0 && target >= 0 && c.up(target) && down() < tolerate) {
        paused = target;
        paused_ballot = c.replica(target)->promised();
        if (c.tracing())
          c.Trace(Format("fault: pause %s r%d", RoleName(c.replica(target)->role()), target));
        c.Pause(target);
        // Usually resumed after a takeover (checked every ms), sometimes
        // before anyone noticed; at the latest after pause_max_us.
        resume_soon = anyone || Bernoulli(rng, 0.2);
        resume_at =
            t + (resume_soon ? Uniform(rng, 100, anyone ? 100'000 : 15'000) : opt.pause_max_us);
      }
    }
    if (t == next_hold) {
      // The one-sided writes of one direction of one link land late, one
      // right after another (TCP retransmitting the transport's connection),
      // while the messages go through.
      next_hold = NextAt(rng, t, opt.hold_one_sided_every_us);
      int a = static_cast<int>(Uniform(rng, 0, n - 1));
      int b = static_cast<int>(Uniform(rng, 0, n - 1));
      uint64_t until = t + Uniform(rng, 1, opt.hold_one_sided_max_us);
      if (a != b) {
        if (c.tracing()) c.Trace(Format("fault: hold one-sided writes r%d -> r%d", a, b));
        c.HoldOneSided(a, b, until);
      }
    }
    if (t == next_unreachable) {
      // The transport of one replica wrongly reports a live peer unreachable.
      next_unreachable = NextAt(rng, t, opt.spurious_unreachable_every_us);
      int a = static_cast<int>(Uniform(rng, 0, n - 1));
      int b = static_cast<int>(Uniform(rng, 0, n - 1));
      if (a != b) c.NotifyUnreachable(a, b);
    }
    if (t == next_handover) {
      // The leader gives up leading (its server diverged, say) to anyone
      // else: a live backup, or one that is down, cut off or paused.
      next_handover = NextAt(rng, t, opt.handover_every_us);
      int l = c.Leader();
      int to = static_cast<int>(Uniform(rng, 0, n - 1));
      uint64_t hold = Uniform(rng, 0, opt.handover_hold_max_us);
      if (l >= 0 && to != l) {
        if (c.tracing()) c.Trace(Format("fault: r%d hands over to r%d", l, to));
        c.HandOver(l, to, hold);
      }
    }
    if (t == next_truncate) {
      next_truncate = NextAt(rng, t, opt.truncate_every_us);
      // By default below what every replica holds durably as committed, so
      // no replica ever needs a snapshot (checkpoints are the guard's
      // business). With truncate_lagging, below what a majority holds: the
      // others may need a snapshot, which the core cannot give them, but a
      // majority can always go on.
      std::vector<uint64_t> held;
      for (int r = 0; r < n; r++) {
        const DurableState& d = c.durable(r);
        uint64_t last = d.first_index + d.slots.size() - 1;
        held.push_back(std::min(d.commit_index, last) + 1);
      }
      std::sort(held.rbegin(), held.rend());
      uint64_t limit = opt.truncate_lagging ? held[n / 2] : held.back();
      int r = static_cast<int>(Uniform(rng, 0, n - 1));
      const Replica* x = c.replica(r);
      if (x && limit > x->first_index()) {
        uint64_t below = Uniform(rng, x->first_index() + 1, limit);
        c.TruncateBelow(r, below);
      }
    }
    if (t == next_propose) {
      next_propose = NextAt(rng, t, opt.propose_every_us);
      int l = c.Leader();
      if (l >= 0) {
        const Replica* x = c.replica(l);
        std::string p = MakePayload(rng, opt, proposals++, x->max_payload());
        EntryType type = (rng() % 16 == 0) ? EntryType::kOutputCheck : EntryType::kInput;
        ProposeResult pr = c.Propose(l, type, p);
        if (pr.ok) c.Track(l, pr.index, type, p);
      }
    }
  }

  // The end: heal everything and require progress.
  if (!c.failed()) {
    if (c.tracing()) c.Trace("end of faults: heal, resume, restart");
    c.SetLossy(false);
    c.Heal();
    for (int r = 0; r < n; r++) {
      if (c.paused(r)) c.Resume(r);
      if (!c.up(r)) c.Restart(r);
    }
    c.RunFor(opt.quiet_us);
  }
  if (!c.failed()) {
    uint64_t deadline = c.now() + opt.progress_timeout_us;
    int probe_at = -1;
    uint64_t probe_inc = 0, probe_index = 0;
    std::string probe;
    int probes = 0;
    bool done = false;
    while (!c.failed() && c.now() < deadline) {
      c.RunFor(1000);
      if (probe_at >= 0) {
        const Replica* x = c.replica(probe_at);
        const Entry* e = x ? x->At(probe_index) : nullptr;
        if (c.incarnation(probe_at) != probe_inc || !e || e->payload != probe) {
          probe_at = -1;  // lost with its leader; propose again
        } else if (c.AllCommitted(probe_index) ||
                   (opt.truncate_lagging && c.MajorityCommitted(probe_index))) {
          bool all = true;
          for (int r = 0; r < n; r++) {
            const Entry* f = c.replica(r)->At(probe_index);
            if (f && c.replica(r)->commit_index() >= probe_index && f->payload != probe)
              all = false;
          }
          if (!all) {
            c.Fail("probe committed with different values");
            break;
          }
          done = true;
          break;
        }
      }
      if (probe_at < 0) {
        int l = c.Leader();
        if (l < 0) continue;
        probe = "probe-" + std::to_string(opt.seed) + "-" + std::to_string(probes++);
        ProposeResult pr = c.Propose(l, EntryType::kInput, probe);
        if (pr.ok) {
          probe_at = l;
          probe_inc = c.incarnation(l);
          probe_index = pr.index;
          c.Track(l, pr.index, EntryType::kInput, probe);
        }
      }
    }
    if (!c.failed() && !done) {
      std::string state;
      for (int r = 0; r < n; r++) {
        const Replica* x = c.replica(r);
        state += Format(" r%d:%s/%s/c%llu/l%llu", r, x ? RoleName(x->role()) : "down",
                        x ? BallotString(x->promised()).c_str() : "-",
                        (U)(x ? x->commit_index() : 0), (U)(x ? x->last_index() : 0));
      }
      c.Fail(Format(
          "progress: no proposal committed on %s replicas within %llums after the "
          "faults healed (probe %s at index %llu;%s)",
          opt.truncate_lagging ? "a majority of" : "all", (U)(opt.progress_timeout_us / 1000),
          probe.c_str(), (U)probe_index, state.c_str()));
    }
  }
  if (!c.failed()) c.CheckAcknowledged();

  res.ok = !c.failed();
  res.committed = c.MaxCommitted();
  res.acknowledged = c.acknowledged();
  res.elections = c.elections();
  res.crashes = c.crashes();
  res.steps = c.steps();
  res.digest = Digest(c);
  res.summary = Format(
      "seed %llu, %d replicas, %llums simulated: %s; committed %llu, acknowledged %llu, "
      "elections %llu, crashes %llu, steps %llu",
      (U)opt.seed, n, (U)(c.now() / 1000), res.ok ? "ok" : "VIOLATION", (U)res.committed,
      (U)res.acknowledged, (U)res.elections, (U)res.crashes, (U)res.steps);
  if (!res.ok) {
    res.violation = c.violation();
    if (keep_trace) res.violation += "\nlast events:\n" + c.TraceTail();
  }
  return res;
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
