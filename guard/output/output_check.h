// output_check.h — the leader's judge of what the replicas' servers sent.
//
// Every replica's shim hashes each connection's output stream by byte offset
// (preload/shim_abi.h, "Output"): the digest at offset o covers the bytes
// [0, o), however the server chunked its writes. The leader's digests are
// the reference (its clients saw those bytes). Backups report theirs to the
// leader; a backup whose digest at the same (connection, offset) differs
// has diverged, unless the backups that reported there agree with each
// other and not with the leader: then the leader is the divergent one.
// Digests cover all that came before them: a backup equal further on agrees
// at every earlier offset. A reply of another size leaves no offset in
// common after it; a backup whose newest point ends elsewhere than the
// leader's newest, and stays its newest for kPendingUs although it had the
// leader's inputs, has diverged in length.
//
// A leader's point marked `cut` says its client went away there (the
// server's send failed with EPIPE or ECONNRESET, or the client reset the
// connection). Its server is told its sends there succeed, and goes on
// until it reads EOF at the connection's CLOSE, as the backups' servers,
// whose replay connections the daemon reads, do; how far each gets before
// that is timing. What a backup sends past the leader's end on such a
// connection reached no client and is not compared (past_cut), nor is
// where a backup's stream stands or ends at or past the cut; its points
// where the leader has one are, and a backup whose stream ends short of
// the cut is still judged. A point
// past the end covers the bytes before it too, but no digest of the
// backup's at the leader's end can be had from it: the bytes between the
// backup's last point at or before the end (the end itself when its server
// chunked as the leader's did, else its last mark or sample) and the end
// go unchecked on that connection, as bytes between two points of unlike
// chunking always did.
//
// Pure bookkeeping, like consensus/core: no I/O and no clock of its own.
// The daemon feeds it points (its own shim's and the backups' reports),
// calls Poll, and carries out the verdicts (a report, a repair).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <vector>

#include "guard/common/conn_key.h"
#include "guard/common/output_point.h"

namespace lockstep {

struct Divergence {
  int replica = -1;  // the divergent replica (the leader's id when the leader is)
  ConnKey key;
  uint64_t offset = 0;  // the checked offset where the digests first differed
  uint64_t leader_digest = 0, replica_digest = 0;
  // The last offset of this connection at which this replica was checked
  // equal to the leader (0: never), and the leader's applied index then and
  // at the differing point: the log window the divergence came from.
  uint64_t agreed_offset = 0, agreed_applied = 0, differ_applied = 0;
  std::vector<int> agreeing;  // replicas whose digest there equalled the reference
  // From the first disagreeing digest there to the verdict (waiting for the
  // other backups' word, at most kVerdictWaitUs).
  uint64_t disputed_us = 0;
  // The streams differ in length: the backup's stream ends at
  // replica_offset, the leader's at offset (no common offset to compare).
  bool length_differs = false;
  uint64_t replica_offset = 0;
};

class OutputChecker {
 public:
  // How long a disagreement waits for the other backups' digests at the
  // same place before it is judged with what arrived.
  static constexpr uint64_t kVerdictWaitUs = 500000;
  // How long a backup's point waits for the leader's point at its offset
  // (the leader's own records may be read later than a fast backup's).
  static constexpr uint64_t kPendingUs = 2000000;
  static constexpr size_t kPointsPerConn = 512;  // leader points kept per connection
  static constexpr size_t kMarksPerConn = 64;    // and mark points besides (a slow backup's)
  static constexpr size_t kMaxPending = 65536;

  // Replicas 0..replicas-1 are the members until SetMembers says otherwise.
  OutputChecker(int replicas, int leader);
  // The configuration changed (a member added or removed through the log):
  // `members` (bit i: replica i, voters and learners) are the backups
  // checked and waited for; the leader is outvoted only by a majority of
  // `voters` agreeing with each other.
  void SetMembers(uint32_t members, int voters);

  void OnLeaderPoint(const OutputPoint& p);
  void OnBackupPoint(int replica, const OutputPoint& p, uint64_t now_us);
  // The connection is gone on the leader and everyone had time to report:
  // its points are forgotten.
  void ForgetConn(const ConnKey& key);
  // The leader's applied index at its newest point on the connection, if
  // replica's output there was checked equal to the leader's up to that
  // point (the whole stream so far agreed); 0 if not (or nothing known).
  // For a state check's probe connection, once closed: the log index up to
  // which that replica's state agreed with the leader's.
  uint64_t AgreedToEnd(int replica, const ConnKey& key) const;
  // A replica judged divergent is not checked until it is repaired.
  void Resume(int replica);
  bool suspended(int replica) const { return suspended_.count(replica) != 0; }

  // Compares what can be compared and returns the verdicts reached.
  std::vector<Divergence> Poll(uint64_t now_us);

  // The oldest log index an open question (a backup's point waiting for
  // the leader's, a disagreement waiting for its verdict) may need in its
  // report: the backup's last agreeing point there (UINT64_MAX: none open).
  // The leader keeps its log from there (Daemon::TruncateLog), so that a
  // verdict can still quote the inputs that caused it.
  uint64_t OldestOpenIndex() const;
  uint64_t checks() const { return checks_; }        // points compared
  uint64_t unchecked() const { return unchecked_; }  // points the leader had none for
  uint64_t past_cut() const { return past_cut_; }    // points past where the leader's client left
  // Open questions: backup points waiting for the leader's, disagreements
  // waiting for their verdict. None open: every point taken so far is judged.
  size_t open() const { return pending_.size() + disputes_.size(); }
  // The ends of streams (ended points) of that backup compared or given up
  // on so far: once a test saw a connection's end settled on every backup
  // and nothing open, any divergence on it has been judged.
  uint64_t ends_settled(int replica) const {
    auto it = ends_settled_.find(replica);
    return it == ends_settled_.end() ? 0 : it->second;
  }

 private:
  struct LeaderRec {
    uint64_t digest;
    uint64_t applied;
    uint32_t agreed_mask;  // backups checked equal here (bit per replica id)
  };
  struct Pending {
    int replica;
    OutputPoint p;
    uint64_t since_us;
    // The leader's last put on the connection when this point last found
    // no match (ConnPoints::last_put, 0: none): until another comes, the
    // next look would find none either (Poll).
    uint64_t leader_put_seen;
  };
  // A disagreement at one place, waiting for the other backups' word.
  struct Dispute {
    uint64_t leader_digest = 0, leader_applied = 0;
    std::map<int, uint64_t> digests;  // replica -> its digest there
    uint64_t since_us = 0;
  };
  using Place = std::pair<ConnKey, uint64_t>;
  // The leader's points of one kind on one connection, by offset, the
  // newest kept. Its shim reports a connection's points in stream order,
  // so a point goes at the back and the oldest leaves at the front: a
  // record of every reply costs no allocation here (a std::map took two
  // and a rebalance per record, a tenth of the leader's added CPU).
  class PointRing {
   public:
    void Put(uint64_t offset, const LeaderRec& rec, size_t keep);
    LeaderRec* Find(uint64_t offset);
    bool empty() const { return points_.empty(); }
    const std::pair<uint64_t, LeaderRec>& newest() const { return points_.back(); }

   private:
    using Points = std::deque<std::pair<uint64_t, LeaderRec>>;  // ascending offsets
    Points::iterator LowerBound(uint64_t offset);               // the first at or past it
    Points points_;
  };
  struct ConnPoints {
    PointRing recent, marks;
    uint64_t last_put =
        0;  // put_seq_ at its newest point (never repeats, not even after ForgetConn)
  };
  // The leader's last put on the connection (ConnPoints::last_put), 0: none.
  uint64_t LastLeaderPut(const ConnKey& key) const;
  LeaderRec* FindLeader(const ConnKey& key, uint64_t offset);
  // The leader's newest point on the connection (recent or mark); null: none.
  const std::pair<uint64_t, LeaderRec>* LeaderNewest(const ConnKey& key) const;
  // The leader's client went away on the connection, and offset is at or
  // past where it did: a backup's point there is compared where the leader
  // has a point, never judged for length.
  bool PastCut(const ConnKey& key, uint64_t offset) const;

  // Compares one backup point with the leader's; false: no leader point yet.
  bool Compare(int replica, const OutputPoint& p, uint64_t now_us);
  void Judge(const Place& at, const Dispute& d, uint64_t now_us, std::vector<Divergence>* out);
  bool AgreedAtOrPast(int replica, const Place& at) const;
  // A backup's point that found no leader point at its offset for
  // kPendingUs: if it is still that backup's newest on the connection, was
  // taken after the backup had been handed what the leader had when it sent
  // its newest, and the two newest offsets differ, the streams differ in
  // length (a reply of another size: no common offset would ever be
  // compared). True if so judged.
  bool JudgeLength(const Pending& p, uint64_t now_us, std::vector<Divergence>* out);
  uint32_t AgreeingMask(const Place& at);  // backups that agree with the leader there

  bool IsMember(int replica) const {
    return replica >= 0 && replica < 32 && ((members_ >> replica) & 1);
  }

  int replicas_, leader_;  // replicas_: one past the highest member id
  uint32_t members_;
  int voters_;
  std::map<ConnKey, ConnPoints> leader_points_;
  uint64_t put_seq_ = 0;             // counts the leader's points taken
  std::map<ConnKey, uint64_t> cut_;  // the leader's connections its client left, and where
  std::map<std::pair<int, ConnKey>, std::pair<uint64_t, uint64_t>> agreed_;  // offset, applied
  std::map<std::pair<int, ConnKey>, OutputPoint> newest_;  // a backup's newest point there
  std::deque<Pending> pending_;
  std::map<Place, Dispute> disputes_;
  std::set<int> suspended_;
  uint64_t checks_ = 0, unchecked_ = 0, past_cut_ = 0;
  std::map<int, uint64_t> ends_settled_;  // replica -> ended points compared or given up on
};

}  // namespace lockstep
