// sim_invariants.cc — the simulator's checks (see sim.h), made after every
// step of a run: agreement, durability, one leader per ballot, the commit
// index never going back, two configurations with disjoint majorities in
// play, leases, and what was acknowledged to clients. The cluster and its
// events are sim.cc's.
#include <algorithm>

#include "consensus/sim.h"
#include "consensus/sim_util.h"

namespace lockstep {

using namespace sim_util;

// Two leaders able to commit in overlapping ballots: a replica leads ballot
// b1 while another leads b2 > b1, yet the voters of the first one's
// configuration include a majority that promised nothing above b1 on disk
// (the retired excepted: they accept nothing more). The second one's phase
// 1 had the durable promises of a majority of its configuration; were every
// majority of the first's to meet every majority of the second's, one of
// them would be in that set. So this finds two configurations with
// disjoint majorities in play at once, whether or not a value diverged yet.
void SimCluster::CheckTwoMajorities() {
  std::vector<int> leaders;
  for (int r = 0; r < n_; r++)
    if (nodes_[r].rep && nodes_[r].rep->role() == Role::kLeader) leaders.push_back(r);
  if (leaders.size() < 2) return;
  for (int a : leaders) {
    const Replica& low = *nodes_[a].rep;
    for (int b : leaders) {
      const Replica& high = *nodes_[b].rep;
      if (high.promised() <= low.promised()) continue;
      uint32_t open = 0;  // could still accept the lower ballot
      for (int r = 0; r < n_; r++)
        if (nodes_[r].present && nodes_[r].durable.promised <= low.promised()) open |= 1u << r;
      if (!low.membership().IsMajority(open)) continue;
      std::string ids;
      for (int r = 0; r < n_; r++)
        if ((open >> r) & 1 && low.membership().IsVoter(r)) ids += " r" + std::to_string(r);
      Fail(Format(
          "membership: two majorities: r%d leads ballot %s with %s and voters {%s } have "
          "promised nothing above it, while r%d leads ballot %s with %s",
          a, BallotString(low.promised()).c_str(), low.membership().ToString().c_str(), ids.c_str(),
          b, BallotString(high.promised()).c_str(), high.membership().ToString().c_str()));
      return;
    }
  }
}

void SimCluster::CheckInvariants() {
  if (failed()) return;
  CheckTwoMajorities();
  if (failed()) return;
  for (int r = 0; r < n_; r++) {
    Node& nd = nodes_[r];
    if (!nd.rep) continue;
    const Replica& x = *nd.rep;
    // One leader per ballot, and a ballot's leader is the replica it names.
    if (x.role() == Role::kLeader) {
      if (BallotLeader(x.promised()) != r) {
        Fail(Format("r%d leads ballot %s of another replica", r,
                    BallotString(x.promised()).c_str()));
        return;
      }
      auto [it, fresh] = leaders_.emplace(x.promised(), std::make_pair(r, nd.incarnation));
      if (!fresh && it->second != std::make_pair(r, nd.incarnation)) {
        Fail(Format("two leaders for ballot %s: r%d incarnation %llu and r%d incarnation %llu",
                    BallotString(x.promised()).c_str(), it->second.first, (U)it->second.second, r,
                    (U)nd.incarnation));
        return;
      }
      if (fresh) SIM_TRACE("r%d: leads ballot %s", r, BallotString(x.promised()).c_str());
    }
    // Agreement: every committed slot equals the first value ever committed there.
    uint64_t c = x.commit_index();
    if (c < nd.checked_upto) {
      Fail(Format("r%d: commit index went back from %llu to %llu", r, (U)nd.checked_upto, (U)c));
      return;
    }
    for (uint64_t i = std::max(nd.checked_upto, x.first_index() - 1) + 1; i <= c; i++) {
      const Entry* e = x.At(i);
      if (!e) {
        Fail(Format("r%d: committed slot %llu missing (log [%llu, %llu])", r, (U)i,
                    (U)x.first_index(), (U)x.last_index()));
        return;
      }
      auto [it, fresh] = committed_.emplace(i, *e);
      if (fresh && e->type == EntryType::kConfig && i > committed_membership_index_) {
        ConfigEntry c;
        std::string why = DecodeConfigEntry(e->payload, &c);
        if (!why.empty()) {
          Fail(Format("r%d committed config entry %llu that does not decode: %s", r, (U)i,
                      why.c_str()));
          return;
        }
        // Committed in index order: the chain of the committed log.
        if (c.from != committed_membership_) {
          SIM_TRACE("membership: committed inert entry %llu (%s against %s)", (U)i,
                    c.to.ToString().c_str(), c.from.ToString().c_str());
          continue;
        }
        const Membership& m = c.to;
        committed_membership_ = m;
        committed_membership_index_ = i;
        committed_configs_[i] = m;
        ever_committed_members_ |= m.voters | m.learners;
        // From now on every leader's configuration is this one or a later
        // one: the configurations in play are it and those in logs past it.
        memberships_seen_.assign(1, m);
        for (const Node& other : nodes_) {
          const DurableState& d = other.durable;
          for (const Entry& s : d.slots) {
            ConfigEntry x;
            if (s.index > i && s.type == EntryType::kConfig &&
                DecodeConfigEntry(s.payload, &x).empty())
              NoteMembership(x.to);
          }
        }
        SIM_TRACE("membership: committed %s at %llu", m.ToString().c_str(), (U)i);
      }
      if (fresh) {
        SIM_TRACE("committed %llu: %s %s (first seen on r%d)", (U)i, EntryTypeName(e->type),
                  Short(e->payload).c_str(), r);
      } else if (!SameValue(it->second, *e)) {
        Fail(Format("agreement: r%d committed slot %llu = %s '%s' but it was committed as %s '%s'",
                    r, (U)i, EntryTypeName(e->type), Short(e->payload).c_str(),
                    EntryTypeName(it->second.type), Short(it->second.payload).c_str()));
        return;
      }
    }
    nd.checked_upto = c;
    CheckLease(r);
    if (failed()) return;
    // Durability: every slot up to the durable index the replica reports (and
    // acks, and counts towards commits) is on its disk with exactly its value.
    uint64_t d = x.durable_index();
    if (d < nd.durable_checked) nd.durable_checked = d;
    for (uint64_t i = nd.durable_checked + 1; i <= d; i++) {
      if (i < x.first_index()) continue;
      const Entry* disk = DurableAt(r, i);
      if (!disk || !(*disk == *x.At(i))) {
        Fail(Format(
            "r%d: reports slot %llu durable (durable index %llu) but its disk holds %s", r, (U)i,
            (U)d,
            disk ? (Short(disk->payload) + " of ballot " + BallotString(disk->ballot)).c_str()
                 : "nothing"));
        return;
      }
    }
    nd.durable_checked = d;
    // Client proposals at r that r now reports committed are acknowledged.
    auto& pend = pending_[r];
    while (!pend.empty() && pend.begin()->first <= c) {
      Tracked t = std::move(pend.begin()->second);
      pend.erase(pend.begin());
      if (t.incarnation != nd.incarnation) continue;
      const Entry* e = x.At(t.index);
      if (!e || !SameValue(*e, t.entry)) continue;  // lost before commit: never acknowledged
      auto it = committed_.find(t.index);
      if (it == committed_.end() || !SameValue(it->second, t.entry)) {
        Fail(Format("acknowledged slot %llu not in the committed record", (U)t.index));
        return;
      }
      t.acked = true;
      SIM_TRACE("acknowledged %llu at r%d: %s", (U)t.index, r, Short(t.entry.payload).c_str());
      acked_.push_back(std::move(t));
    }
  }
}

// A replica that holds a lease may answer a read from its own state: no
// other replica may lead a higher ballot meanwhile, and no slot may be
// committed that it does not know committed (a read would miss it).
void SimCluster::CheckLease(int r) {
  const Replica& x = *nodes_[r].rep;
  uint64_t until = x.LeaseUntil();
  if (until == 0 || until + opt_.lease_check_overrun_us <= now_) return;
  lease_checks_++;
  for (int q = 0; q < n_; q++) {
    const Replica* y = replica(q);
    if (q == r || !y) continue;
    if (y->role() == Role::kLeader && y->promised() > x.promised()) {
      Fail(Format("lease: r%d holds a lease of ballot %s until %llu, yet r%d leads ballot %s", r,
                  BallotString(x.promised()).c_str(), (U)until, q,
                  BallotString(y->promised()).c_str()));
      return;
    }
  }
  if (!committed_.empty() && committed_.rbegin()->first > x.commit_index()) {
    Fail(Format(
        "lease: r%d holds a lease until %llu at commit index %llu, yet slot %llu is committed", r,
        (U)until, (U)x.commit_index(), (U)committed_.rbegin()->first));
  }
}

void SimCluster::CheckAcknowledged() {
  for (const Tracked& t : acked_) {
    auto it = committed_.find(t.index);
    if (it == committed_.end() || !SameValue(it->second, t.entry)) {
      Fail(Format("durability: acknowledged slot %llu lost", (U)t.index));
      return;
    }
    for (int r = 0; r < n_; r++) {
      const Replica* x = replica(r);
      if (!x || x->commit_index() < t.index) continue;
      const Entry* e = x->At(t.index);
      if (e && !SameValue(*e, t.entry)) {
        Fail(Format("durability: r%d holds %s at acknowledged slot %llu, not %s", r,
                    Short(e->payload).c_str(), (U)t.index, Short(t.entry.payload).c_str()));
        return;
      }
    }
  }
  // Whole committed prefixes, not only what was checked incrementally.
  for (int r = 0; r < n_; r++) {
    const Replica* x = replica(r);
    if (!x) continue;
    for (uint64_t i = x->first_index(); i <= x->commit_index(); i++) {
      auto it = committed_.find(i);
      if (it == committed_.end() || !SameValue(it->second, *x->At(i))) {
        Fail(Format("agreement: r%d slot %llu differs from the committed record", r, (U)i));
        return;
      }
    }
  }
}

}  // namespace lockstep
