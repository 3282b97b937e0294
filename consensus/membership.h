// membership.h — the cluster's configuration as the log carries it: which
// replica ids vote and which only learn, and the one encoder and decoder of
// a kConfig entry's payload. Pure values: no I/O, no protocol (the rules of
// changing it are the core's, core.h "Membership change").
//
// Ids are small ints below kMaxMemberIds; a configuration also carries the
// lowest id never used (next_id), so a replica added later takes a fresh id
// and an id is never reused (a removed replica's old log and promises can
// never be mistaken for a newcomer's).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep {

inline constexpr int kMaxMemberIds = 16;  // ids 0..15 (ballots carry 8 bits of id)
inline constexpr int kMaxVoters = 7;      // as kMaxReplicas: 3, 5 or 7 in practice

// What a replica is in the configuration it holds (Replica::member_state).
enum class MemberState : uint8_t {
  kVoter,    // counts toward majorities, may stand for election
  kLearner,  // receives the stream, never counts, never stands
  kRemoved,  // not in the configuration (removed, or not yet added)
};
const char* MemberStateName(MemberState s);

// Calls fn(id) for every id set in mask (bit i: replica i), lowest first.
template <typename Fn>
void ForEachId(uint32_t mask, Fn fn) {
  for (int id = 0; id < kMaxMemberIds; id++)
    if ((mask >> id) & 1) fn(id);
}

// One change at a time (single-server changes, core.h).
enum class MembershipChangeKind : uint8_t {
  kAddLearner = 1,  // a new replica, with a fresh id, starts receiving the stream
  kPromote = 2,     // a learner becomes a voter
  kRemove = 3,      // a voter or a learner leaves
};
const char* MembershipChangeKindName(MembershipChangeKind k);

struct MembershipChange {
  MembershipChangeKind kind = MembershipChangeKind::kAddLearner;
  int id = -1;
};

struct Membership {
  uint16_t voters = 0;    // bit i: replica i votes
  uint16_t learners = 0;  // bit i: replica i learns (never also a voter)
  uint8_t next_id = 0;    // every id below was used at some time

  // Voters 0..replicas-1, no learners: what CoreConfig::replicas means.
  static Membership Initial(int replicas);

  bool IsVoter(int id) const { return InRange(id) && (voters >> id) & 1; }
  bool IsLearner(int id) const { return InRange(id) && (learners >> id) & 1; }
  bool IsMember(int id) const { return IsVoter(id) || IsLearner(id); }
  MemberState StateOf(int id) const {
    return IsVoter(id)     ? MemberState::kVoter
           : IsLearner(id) ? MemberState::kLearner
                           : MemberState::kRemoved;
  }
  int VoterCount() const { return __builtin_popcount(voters); }
  int Majority() const { return VoterCount() / 2 + 1; }
  // Whether the replicas in `ids` (bit i: replica i) include a majority of the voters.
  bool IsMajority(uint32_t ids) const { return __builtin_popcount(ids & voters) >= Majority(); }
  // "voters {0,1,2} learners {3}".
  std::string ToString() const;
  bool operator==(const Membership&) const = default;

  static bool InRange(int id) { return id >= 0 && id < kMaxMemberIds; }
};

// `from` changed by `change` into *to; "" when valid, else why not, for a
// person (an unknown id, a reused id, promoting a non-learner, removing the
// last voter, more than kMaxVoters voters).
std::string ApplyMembershipChange(const Membership& from, const MembershipChange& change,
                                  Membership* to);

// Whether every majority of a's voters shares a replica with every majority
// of b's: true for the same voters or voters one replica apart (the
// single-server rule), and what the simulator checks of two leaders.
bool MajoritiesIntersect(const Membership& a, const Membership& b);

// Whether `to` is `from` after exactly one valid change (ApplyMembershipChange).
bool IsOneChange(const Membership& from, const Membership& to);

// A kConfig entry: the configuration it was proposed against and the one
// it makes. It takes effect in a log only where the log's configuration
// just before it is `from` (core.h, "Membership change": a change proposed
// against another history is inert), so every log's configurations form a
// chain of single changes.
struct ConfigEntry {
  Membership from;
  Membership to;
  bool operator==(const ConfigEntry&) const = default;
};

// A kConfig entry's payload: "LKM1", a version byte, then `from` and `to`,
// each as voters and learners (little-endian 16-bit masks) and next_id, and
// a CRC32C of what precedes it.
inline constexpr size_t kConfigPayloadSize = 19;
std::string EncodeConfigEntry(const ConfigEntry& entry);
// Never reads past bytes.size(); "" when it holds a valid entry (each side
// a valid configuration: at least one voter, no id both voter and learner,
// every id below next_id, at most kMaxVoters voters; `to` one change from
// `from`), else what is wrong, for a person.
std::string DecodeConfigEntry(std::string_view bytes, ConfigEntry* out);

// One configuration on its own (a kTruncate record's note, a checkpoint's
// restore point): "LKC1", a version byte, voters, learners, next_id as in
// a kConfig entry, and a CRC32C of what precedes it. Decode: "" when the
// bytes hold a valid configuration, else what is wrong.
inline constexpr size_t kMembershipPayloadSize = 14;
std::string EncodeMembership(const Membership& m);
std::string DecodeMembership(std::string_view bytes, Membership* out);

}  // namespace lockstep
