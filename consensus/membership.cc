// membership.cc — configurations, their changes and the kConfig payload
// (see membership.h).
#include "consensus/membership.h"

#include <algorithm>
#include <cstring>

#include "consensus/log_format.h"

namespace lockstep {

namespace {
constexpr char kMagic[4] = {'L', 'K', 'M', '1'};
constexpr char kMembershipMagic[4] = {'L', 'K', 'C', '1'};
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

bool IsOneChange(const Membership& from, const Membership& to) {
  for (int id = 0; id < kMaxMemberIds; id++)
    for (MembershipChangeKind k : {MembershipChangeKind::kAddLearner,
                                   MembershipChangeKind::kPromote, MembershipChangeKind::kRemove}) {
      Membership m;
      if (ApplyMembershipChange(from, MembershipChange{k, id}, &m).empty() && m == to) return true;
    }
  return false;
}

namespace {

void PutMembership(uint8_t* p, const Membership& m) {
  p[0] = static_cast<uint8_t>(m.voters);
  p[1] = static_cast<uint8_t>(m.voters >> 8);
  p[2] = static_cast<uint8_t>(m.learners);
  p[3] = static_cast<uint8_t>(m.learners >> 8);
  p[4] = m.next_id;
}

std::string GetMembership(const uint8_t* p, const char* side, Membership* out) {
  Membership m;
  m.voters = static_cast<uint16_t>(p[0] | (p[1] << 8));
  m.learners = static_cast<uint16_t>(p[2] | (p[3] << 8));
  m.next_id = p[4];
  std::string what;
  if (m.voters == 0)
    what = "has no voters";
  else if (m.voters & m.learners)
    what = "has an id both voter and learner";
  else if (m.next_id > kMaxMemberIds)
    what = "has a next id out of range";
  else if ((m.voters | m.learners) >> m.next_id)
    what = "holds an id at or above its next id";
  else if (m.VoterCount() > kMaxVoters)
    what = "has more than 7 voters";
  if (!what.empty()) return std::string("configuration entry's ") + side + " configuration " + what;
  *out = m;
  return "";
}

}  // namespace

std::string EncodeConfigEntry(const ConfigEntry& entry) {
  std::string out(kConfigPayloadSize, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  memcpy(p, kMagic, 4);
  p[4] = kVersion;
  PutMembership(p + 5, entry.from);
  PutMembership(p + 10, entry.to);
  uint32_t crc = Crc32c(0, p, 15);
  for (int i = 0; i < 4; i++) p[15 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return out;
}

std::string DecodeConfigEntry(std::string_view bytes, ConfigEntry* out) {
  if (bytes.size() != kConfigPayloadSize)
    return "configuration entry of " + std::to_string(bytes.size()) + " bytes (expected " +
           std::to_string(kConfigPayloadSize) + ")";
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (memcmp(p, kMagic, 4) != 0) return "not a configuration entry (bad magic)";
  if (p[4] != kVersion) return "configuration entry version " + std::to_string(p[4]) + " unknown";
  uint32_t crc = 0;
  for (int i = 0; i < 4; i++) crc |= static_cast<uint32_t>(p[15 + i]) << (8 * i);
  if (crc != Crc32c(0, p, 15)) return "configuration entry checksum mismatch";
  ConfigEntry e;
  std::string why = GetMembership(p + 5, "old", &e.from);
  if (why.empty()) why = GetMembership(p + 10, "new", &e.to);
  if (!why.empty()) return why;
  if (!IsOneChange(e.from, e.to))
    return "configuration entry changes more than one replica (" + e.from.ToString() + " to " +
           e.to.ToString() + ")";
  *out = e;
  return "";
}

std::string EncodeMembership(const Membership& m) {
  std::string out(kMembershipPayloadSize, '\0');
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  memcpy(p, kMembershipMagic, 4);
  p[4] = kVersion;
  PutMembership(p + 5, m);
  uint32_t crc = Crc32c(0, p, 10);
  for (int i = 0; i < 4; i++) p[10 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return out;
}

std::string DecodeMembership(std::string_view bytes, Membership* out) {
  if (bytes.size() != kMembershipPayloadSize)
    return "configuration of " + std::to_string(bytes.size()) + " bytes (expected " +
           std::to_string(kMembershipPayloadSize) + ")";
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (memcmp(p, kMembershipMagic, 4) != 0) return "not a configuration (bad magic)";
  if (p[4] != kVersion) return "configuration version " + std::to_string(p[4]) + " unknown";
  uint32_t crc = 0;
  for (int i = 0; i < 4; i++) crc |= static_cast<uint32_t>(p[10 + i]) << (8 * i);
  if (crc != Crc32c(0, p, 10)) return "configuration checksum mismatch";
  return GetMembership(p + 5, "recorded", out);
}

}  // namespace lockstep
