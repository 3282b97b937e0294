// output_check.cc — see output_check.h.
#include "guard/output/output_check.h"

#include <algorithm>

#include "consensus/assert.h"

namespace lockstep {

OutputChecker::OutputChecker(int replicas, int leader)
    : replicas_(replicas),
      leader_(leader),
      members_(replicas >= 32 ? ~0u : (1u << replicas) - 1),
      voters_(replicas) {
  LS_ASSERT(replicas >= 1 && replicas <= 32 && leader >= 0 && leader < replicas,
            "output checker for replica %d of %d", leader, replicas);
}

void OutputChecker::SetMembers(uint32_t members, int voters) {
  members_ = members | (1u << leader_);
  voters_ = std::max(voters, 1);
  replicas_ = 32 - __builtin_clz(members_);
}

OutputChecker::PointRing::Points::iterator OutputChecker::PointRing::LowerBound(uint64_t offset) {
  return std::lower_bound(points_.begin(), points_.end(), offset,
                          [](const auto& e, uint64_t o) { return e.first < o; });
}

void OutputChecker::PointRing::Put(uint64_t offset, const LeaderRec& rec, size_t keep) {
  if (points_.empty() || points_.back().first < offset) {
    points_.emplace_back(offset, rec);
  } else {
    // Not past the newest: the same offset again (a close after the last
    // send), else out of order, which the shim never reports; kept sorted
    // all the same.
    auto at = LowerBound(offset);
    if (at != points_.end() && at->first == offset)
      at->second = rec;
    else
      points_.emplace(at, offset, rec);
  }
  while (points_.size() > keep) points_.pop_front();
}

OutputChecker::LeaderRec* OutputChecker::PointRing::Find(uint64_t offset) {
  auto at = LowerBound(offset);
  return at != points_.end() && at->first == offset ? &at->second : nullptr;
}

void OutputChecker::OnLeaderPoint(const OutputPoint& p) {
  if (p.cut) cut_.emplace(p.key, p.offset);
  ConnPoints& c = leader_points_[p.key];
  (p.mark ? c.marks : c.recent)
      .Put(p.offset, LeaderRec{p.digest, p.applied, 0}, p.mark ? kMarksPerConn : kPointsPerConn);
  c.last_put = ++put_seq_;
}

uint64_t OutputChecker::LastLeaderPut(const ConnKey& key) const {
  auto conn = leader_points_.find(key);
  return conn == leader_points_.end() ? 0 : conn->second.last_put;
}

OutputChecker::LeaderRec* OutputChecker::FindLeader(const ConnKey& key, uint64_t offset) {
  auto conn = leader_points_.find(key);
  if (conn == leader_points_.end()) return nullptr;
  for (PointRing* points : {&conn->second.recent, &conn->second.marks})
    if (LeaderRec* rec = points->Find(offset)) return rec;
  return nullptr;
}

const std::pair<uint64_t, OutputChecker::LeaderRec>* OutputChecker::LeaderNewest(
    const ConnKey& key) const {
  auto conn = leader_points_.find(key);
  if (conn == leader_points_.end()) return nullptr;
  const PointRing* in = nullptr;  // marks are kept apart: the newer of the two rings' newest
  for (const PointRing* points : {&conn->second.recent, &conn->second.marks})
    if (!points->empty() && (!in || points->newest().first > in->newest().first)) in = points;
  return in ? &in->newest() : nullptr;
}

bool OutputChecker::PastCut(const ConnKey& key, uint64_t offset) const {
  // Past the cut the leader's server goes on "sending" (the shim tells it
  // its sends succeed, so that it reads what was agreed before the
  // client's CLOSE: preload/shim_output.c as_sent), and how far each server
  // gets there (until it reads EOF, or its daemon stops reading its replay
  // connection) is a matter of timing. A point there that the leader has
  // too was compared already (Compare).
  auto cut = cut_.find(key);
  return cut != cut_.end() && offset >= cut->second;
}

void OutputChecker::OnBackupPoint(int replica, const OutputPoint& p, uint64_t now_us) {
  if (!IsMember(replica) || replica == leader_ || suspended(replica)) return;
  OutputPoint& newest = newest_[{replica, p.key}];
  if (p.offset >= newest.offset) newest = p;
  if (Compare(replica, p, now_us)) return;
  if (pending_.size() >= kMaxPending) {
    if (pending_.front().p.ended) ends_settled_[pending_.front().replica]++;
    pending_.pop_front();
    unchecked_++;
  }
  pending_.push_back(Pending{replica, p, now_us, LastLeaderPut(p.key)});
}

bool OutputChecker::Compare(int replica, const OutputPoint& p, uint64_t now_us) {
  LeaderRec* found = FindLeader(p.key, p.offset);
  if (!found) return false;
  LeaderRec& ref = *found;
  checks_++;
  if (p.ended) ends_settled_[replica]++;
  Place place{p.key, p.offset};
  if (p.digest == ref.digest) {
    ref.agreed_mask |= 1u << replica;
    auto& agreed = agreed_[{replica, p.key}];
    if (p.offset >= agreed.first) agreed = {p.offset, ref.applied};
    return true;
  }
  Dispute& d = disputes_[place];
  if (d.digests.empty()) {
    d.leader_digest = ref.digest;
    d.leader_applied = ref.applied;
    d.since_us = now_us;
  }
  d.digests[replica] = p.digest;
  return true;
}

uint64_t OutputChecker::AgreedToEnd(int replica, const ConnKey& key) const {
  const auto* newest = LeaderNewest(key);
  auto a = agreed_.find({replica, key});
  if (!newest || a == agreed_.end() || a->second.first < newest->first) return 0;
  return newest->second.applied;
}

bool OutputChecker::AgreedAtOrPast(int replica, const Place& at) const {
  auto a = agreed_.find({replica, at.first});
  return a != agreed_.end() && a->second.first >= at.second;
}

uint32_t OutputChecker::AgreeingMask(const Place& at) {
  const LeaderRec* rec = FindLeader(at.first, at.second);
  uint32_t mask = rec ? rec->agreed_mask : 0;
  // A digest covers the whole stream before its offset: a backup checked
  // equal to the leader at or past this place agrees here too, even when
  // its writes ended elsewhere and it never reported this offset (under
  // load, chunking differs, and waiting for its point here would wait out
  // kVerdictWaitUs).
  for (int r = 0; r < replicas_; r++)
    if (IsMember(r) && r != leader_ && AgreedAtOrPast(r, at)) mask |= 1u << r;
  return mask;
}

void OutputChecker::Judge(const Place& at, const Dispute& d, uint64_t now_us,
                          std::vector<Divergence>* out) {
  uint32_t mask = AgreeingMask(at);
  std::vector<int> agreeing;
  for (int r = 0; r < replicas_; r++)
    if (mask & (1u << r)) agreeing.push_back(r);
  auto make = [&](int replica, uint64_t digest) {
    Divergence v;
    v.replica = replica;
    v.key = at.first;
    v.offset = at.second;
    v.leader_digest = d.leader_digest;
    v.replica_digest = digest;
    v.differ_applied = d.leader_applied;
    v.disputed_us = now_us - d.since_us;
    auto a = agreed_.find({replica, at.first});
    if (a != agreed_.end() && a->second.first < at.second) {
      v.agreed_offset = a->second.first;
      v.agreed_applied = a->second.second;
    }
    return v;
  };
  // The leader is outvoted only by a majority of the cluster that agrees
  // with itself: backups enough to elect a leader without it, all with one
  // digest, and none on its side.
  size_t majority = static_cast<size_t>(voters_ / 2 + 1);
  if (agreeing.empty() && d.digests.size() >= majority) {
    uint64_t first = d.digests.begin()->second;
    bool one_voice = true;
    for (const auto& [r, digest] : d.digests) one_voice &= digest == first;
    if (one_voice) {
      Divergence v = make(leader_, d.leader_digest);
      v.replica_digest = first;
      v.agreed_offset = v.agreed_applied = 0;  // no agreed point of the leader's own
      for (const auto& [r, digest] : d.digests) v.agreeing.push_back(r);
      suspended_.insert(leader_);
      out->push_back(std::move(v));
      return;
    }
  }
  for (const auto& [r, digest] : d.digests) {
    if (suspended(r)) continue;
    Divergence v = make(r, digest);
    v.agreeing = agreeing;
    suspended_.insert(r);
    out->push_back(std::move(v));
  }
}

bool OutputChecker::JudgeLength(const Pending& p, uint64_t now_us, std::vector<Divergence>* out) {
  auto mine = newest_.find({p.replica, p.p.key});
  const auto* newest = LeaderNewest(p.p.key);
  if (mine == newest_.end() || mine->second.offset != p.p.offset || !newest ||
      suspended(leader_))  // the leader is judged already: it hands over
    return false;
  uint64_t offset = newest->first;
  const LeaderRec& ref = newest->second;
  // A backup behind the leader's newest point may yet send what it lacks;
  // one whose stream ended never will (its server closed the connection:
  // a login its server refused, a request it failed on).
  if (offset == p.p.offset || (p.p.applied < ref.applied && !p.p.ended)) return false;
  // Outvoted, as in Judge: every other backup that is checked ends where
  // this one does with the same digest, they are a majority of the
  // cluster, and none ends with the leader: the leader's length is the odd one.
  size_t same = 1, others = 0;
  for (int r = 0; r < replicas_; r++) {
    if (!IsMember(r) || r == leader_ || r == p.replica || suspended(r)) continue;
    others++;
    auto theirs = newest_.find({r, p.p.key});
    if (theirs != newest_.end() && theirs->second.offset == p.p.offset &&
        theirs->second.digest == p.p.digest &&
        (theirs->second.applied >= ref.applied || theirs->second.ended))
      same++;
  }
  if (same == others + 1 && same >= static_cast<size_t>(voters_ / 2 + 1) &&
      !AgreeingMask({p.p.key, offset})) {
    Divergence v;
    v.replica = leader_;
    v.key = p.p.key;
    v.offset = offset;
    v.leader_digest = ref.digest;
    v.replica_digest = p.p.digest;
    v.differ_applied = ref.applied;
    v.disputed_us = now_us - p.since_us;
    v.length_differs = true;
    v.replica_offset = p.p.offset;
    for (int r = 0; r < replicas_; r++)
      if (IsMember(r) && r != leader_ && !suspended(r)) v.agreeing.push_back(r);
    suspended_.insert(leader_);
    out->push_back(std::move(v));
    return true;
  }
  Divergence v;
  v.replica = p.replica;
  v.key = p.p.key;
  v.offset = offset;  // the reference's end; the backup's stream ends elsewhere
  v.leader_digest = ref.digest;
  v.replica_digest = p.p.digest;
  v.differ_applied = ref.applied;
  v.disputed_us = now_us - p.since_us;
  v.length_differs = true;
  v.replica_offset = p.p.offset;
  auto a = agreed_.find({p.replica, p.p.key});
  if (a != agreed_.end() && a->second.first < offset) {
    v.agreed_offset = a->second.first;
    v.agreed_applied = a->second.second;
  }
  uint32_t mask = AgreeingMask({p.p.key, offset});
  for (int r = 0; r < replicas_; r++)
    if (mask & (1u << r)) v.agreeing.push_back(r);
  suspended_.insert(p.replica);
  out->push_back(std::move(v));
  return true;
}

std::vector<Divergence> OutputChecker::Poll(uint64_t now_us) {
  std::vector<Divergence> out;
  // Backup points that came before the leader's.
  for (size_t n = pending_.size(); n > 0; n--) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    if (suspended(p.replica)) continue;
    // Compared again only once the leader put a point on that connection
    // since: each look is two binary searches, and a backup's point that
    // has none (its replies chunked otherwise) waits kPendingUs, looked
    // at on every pass of the daemon's loop (9% of a leader daemon's CPU
    // under 16 connections' SETs).
    uint64_t put = LastLeaderPut(p.p.key);
    if (put != p.leader_put_seen) {
      if (Compare(p.replica, p.p, now_us)) continue;
      p.leader_put_seen = put;
    }
    if (now_us - p.since_us >= kPendingUs) {
      if (PastCut(p.p.key, p.p.offset))
        past_cut_++;  // the leader's client left before: no client got these bytes
      else if (!JudgeLength(p, now_us, &out))
        unchecked_++;  // the leader never had a point there (its writes ended elsewhere)
      if (p.p.ended) ends_settled_[p.replica]++;
      continue;
    }
    pending_.push_back(std::move(p));
  }
  for (auto it = disputes_.begin(); it != disputes_.end();) {
    const Dispute& d = it->second;
    size_t backups = 0, heard = 0;
    uint32_t mask = AgreeingMask(it->first);
    for (int r = 0; r < replicas_; r++) {
      if (!IsMember(r) || r == leader_ || suspended(r)) continue;
      backups++;
      if (d.digests.count(r) || (mask & (1u << r))) heard++;
    }
    if (heard < backups && now_us - d.since_us < kVerdictWaitUs) {
      ++it;
      continue;
    }
    Judge(it->first, d, now_us, &out);
    it = disputes_.erase(it);
  }
  return out;
}

uint64_t OutputChecker::OldestOpenIndex() const {
  uint64_t oldest = UINT64_MAX;
  auto window_start = [&](int replica, const ConnKey& key, uint64_t differ_applied) {
    auto a = agreed_.find({replica, key});
    oldest = std::min(oldest, a != agreed_.end() ? a->second.second : differ_applied);
  };
  for (const Pending& p : pending_) window_start(p.replica, p.p.key, p.p.applied);
  for (const auto& [place, d] : disputes_)
    for (const auto& [replica, digest] : d.digests)
      window_start(replica, place.first, d.leader_applied);
  return oldest;
}

void OutputChecker::ForgetConn(const ConnKey& key) {
  leader_points_.erase(key);
  cut_.erase(key);
  for (auto it = agreed_.begin(); it != agreed_.end();)
    it = it->first.second == key ? agreed_.erase(it) : std::next(it);
  for (auto it = newest_.begin(); it != newest_.end();)
    it = it->first.second == key ? newest_.erase(it) : std::next(it);
}

void OutputChecker::Resume(int replica) {
  suspended_.erase(replica);
  for (auto it = agreed_.begin(); it != agreed_.end();)
    it = it->first.first == replica ? agreed_.erase(it) : std::next(it);
  // A repaired server sends from its checkpoint's offsets again.
  for (auto it = newest_.begin(); it != newest_.end();)
    it = it->first.first == replica ? newest_.erase(it) : std::next(it);
  // What it reported before its repair, still open (a place whose verdict
  // waited for the other backups, a point the leader had not reached), was
  // the replaced server's: judged now, it made a second report of a
  // repaired replica (CI under ASan: 500 ms after the first verdict, the
  // repair done in between).
  for (auto it = disputes_.begin(); it != disputes_.end();) {
    it->second.digests.erase(replica);
    it = it->second.digests.empty() ? disputes_.erase(it) : std::next(it);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->replica != replica) {
      ++it;
      continue;
    }
    if (it->p.ended) ends_settled_[replica]++;
    it = pending_.erase(it);
  }
}

}  // namespace lockstep
