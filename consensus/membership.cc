// membership.cc — configurations, their changes and the kConfig payload
// (see membership.h).
#include "consensus/membership.h"

#include <algorithm>
#include <cstring>

#include "consensus/log_format.h"

namespace lockstep {

namespace {
constexpr char kMagic[4] = {'L', 'K', 'M', '1'};
constexpr uint8_t kVersion = 1;

std::string IdList(uint16_t mask) {
  std::string s = "{";
  for (int i = 0; i < kMaxMemberIds; i++) {
    if (!((mask >> i) & 1)) continue;
    if (s.size() > 1) s += ",";
    s += std::to_string(i);
  }
  return s + "}";
}
}  // namespace

const char* MemberStateName(MemberState s) {
  switch (s) {
    case MemberState::kVoter: return "voter";
    case MemberState::kLearner: return "learner";
    case MemberState::kRemoved: return "removed";
  }
  return "?";
}

const char* MembershipChangeKindName(MembershipChangeKind k) {
  switch (k) {
    case MembershipChangeKind::kAddLearner: return "add-learner";
    case MembershipChangeKind::kPromote: return "promote";
    case MembershipChangeKind::kRemove: return "remove";
  }
  return "?";
}

Membership Membership::Initial(int replicas) {
  Membership m;
  replicas = std::clamp(replicas, 0, kMaxMemberIds);
  m.voters = static_cast<uint16_t>((1u << replicas) - 1);
  m.next_id = static_cast<uint8_t>(replicas);
  return m;
}

std::string Membership::ToString() const {
  std::string s = "voters " + IdList(voters);
  if (learners) s += " learners " + IdList(learners);
  return s;
}

std::string ApplyMembershipChange(const Membership& from, const MembershipChange& change,
                                  Membership* to) {
  const int id = change.id;
  const std::string who = "replica " + std::to_string(id);
  if (!Membership::InRange(id))
    return who + " is not a valid id (ids 0.." + std::to_string(kMaxMemberIds - 1) + ")";
  Membership m = from;
  switch (change.kind) {
    case MembershipChangeKind::kAddLearner:
      if (from.IsMember(id)) return who + " is already a " + MemberStateName(from.StateOf(id));
      if (id < from.next_id)
        return who + " was a member before: a new replica takes a fresh id (" +
               std::to_string(from.next_id) + " or above)";
      m.learners |= static_cast<uint16_t>(1u << id);
      m.next_id = static_cast<uint8_t>(id + 1);
      break;
    case MembershipChangeKind::kPromote:
      if (!from.IsLearner(id)) return who + " is not a learner (add it as a learner first)";
      if (from.VoterCount() >= kMaxVoters)
        return "the configuration has " + std::to_string(from.VoterCount()) +
               " voters already, the most it may have";
      m.learners &= static_cast<uint16_t>(~(1u << id));
      m.voters |= static_cast<uint16_t>(1u << id);
      break;
    case MembershipChangeKind::kRemove:
      if (!from.IsMember(id)) return who + " is not in the configuration";
      if (from.IsVoter(id) && from.VoterCount() == 1) return who + " is the last voter";
      m.voters &= static_cast<uint16_t>(~(1u << id));
      m.learners &= static_cast<uint16_t>(~(1u << id));
      break;
    default: return "unknown kind of change";
  }
  *to = m;
  return "";
}

bool MajoritiesIntersect(const Membership& a, const Membership& b) {
  // Two disjoint majorities exist when each can be filled from the voters
  // the other lacks plus its share of the common ones.
  int common = __builtin_popcount(a.voters & b.voters);
  int only_a = __builtin_popcount(a.voters & ~b.voters);
  int only_b = __builtin_popcount(b.voters & ~a.voters);
  int need_a = std::max(0, a.Majority() - only_a);
  int need_b = std::max(0, b.Majority() - only_b);
  return need_a + need_b > common;
}

std::string EncodeMembership(const Membership& m) {
  std::string out(kMembershipPayloadSize, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  memcpy(p, kMagic, 4);
  p[4] = kVersion;
  p[5] = static_cast<uint8_t>(m.voters);
  p[6] = static_cast<uint8_t>(m.voters >> 8);
  p[7] = static_cast<uint8_t>(m.learners);
  p[8] = static_cast<uint8_t>(m.learners >> 8);
  p[9] = m.next_id;
  uint32_t crc = Crc32c(0, p, 10);
  for (int i = 0; i < 4; i++) p[10 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return out;
}

std::string DecodeMembership(std::string_view bytes, Membership* out) {
  if (bytes.size() != kMembershipPayloadSize)
    return "configuration payload of " + std::to_string(bytes.size()) + " bytes (expected " +
           std::to_string(kMembershipPayloadSize) + ")";
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (memcmp(p, kMagic, 4) != 0) return "not a configuration (bad magic)";
  if (p[4] != kVersion) return "configuration version " + std::to_string(p[4]) + " unknown";
  uint32_t crc = 0;
  for (int i = 0; i < 4; i++) crc |= static_cast<uint32_t>(p[10 + i]) << (8 * i);
  if (crc != Crc32c(0, p, 10)) return "configuration checksum mismatch";
  Membership m;
  m.voters = static_cast<uint16_t>(p[5] | (p[6] << 8));
  m.learners = static_cast<uint16_t>(p[7] | (p[8] << 8));
  m.next_id = p[9];
  if (m.voters == 0) return "configuration without voters";
  if (m.voters & m.learners) return "configuration with an id both voter and learner";
  if (m.next_id > kMaxMemberIds) return "configuration's next id out of range";
  if ((m.voters | m.learners) >> m.next_id) return "configuration holds an id at or above next id";
  if (m.VoterCount() > kMaxVoters) return "configuration with more than 7 voters";
  *out = m;
  return "";
}

}  // namespace lockstep
