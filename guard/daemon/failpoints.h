// failpoints.h — faults injected on purpose into one running replica, for
// the fault runner (scripts/faults) and the tests: its messages to its peers
// dropped or delayed (this kernel has no netem), its durable writes slowed,
// its clock jumping ahead, its next log append torn by a crash. A replica
// accepts them only with failpoints = true in cluster.toml (`cluster up
// --failpoints`) or LOCKSTEP_FAILPOINTS=1 in its environment, and only from
// an admin (`lockstep failpoint`); each new spec replaces the last. Every
// random draw comes from a generator seeded by the spec, so the faults of a
// run replay from its seed.
//
// Spec text: space-separated key=value, or "off".
//   drop=P          each message to a peer is lost with probability P (0..1)
//   delay_ms=D      each message to a peer leaves D ms late ...
//   jitter_ms=J     ... plus up to J ms more (the order to one peer is kept,
//                   as TCP keeps it)
//   to=ID           only the messages to replica ID (default: to every peer)
//   disk_delay_ms=D each durable write waits D ms first (a slow disk)
//   clock_jump_ms=D this replica's clock jumps D ms ahead, once (as if it
//                   alone had been paused; its timers see the time pass)
//   torn_write=1    the next log append writes only the sectors before the
//                   one holding its last record's canary, and the replica
//                   exits at once with status 86 (a crash between a header
//                   and its canary, when that record spans sectors)
//   seed=S          the generator's seed (default 1)
// Only peer messages (elections, heartbeats) are dropped or delayed: the
// log's one-sided puts are not, since UCX delivers them reliably and in
// order or fails the endpoint (which a partition by the nemesis covers).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "consensus/core.h"

namespace lockstep {

struct FailpointSpec {
  double drop = 0;
  uint32_t delay_ms = 0;
  uint32_t jitter_ms = 0;
  int to = -1;  // -1: every peer
  uint32_t disk_delay_ms = 0;
  uint32_t clock_jump_ms = 0;
  bool torn_write = false;
  uint64_t seed = 1;
};

// False with a message naming the bad key or value.
bool ParseFailpointSpec(std::string_view text, FailpointSpec* out, std::string* error);
// The spec as text ParseFailpointSpec reads back; "off" when nothing is set.
std::string FormatFailpointSpec(const FailpointSpec& spec);

// The messages-to-peers half: which are lost, which wait, and when they go.
class MessageFaults {
 public:
  void Set(const FailpointSpec& spec);
  // True when the caller must not send m now: dropped, or held (Due hands
  // it back later).
  bool Intercept(const Message& m, uint64_t now_us);
  // The held messages whose time has come, oldest first.
  std::vector<Message> Due(uint64_t now_us);
  uint64_t dropped() const { return dropped_; }
  uint64_t delayed() const { return delayed_; }

 private:
  FailpointSpec spec_;
  std::mt19937_64 rng_{1};
  struct Held {
    uint64_t due_us;
    Message m;
  };
  std::deque<Held> held_;
  std::vector<uint64_t> last_due_us_;  // by destination: keeps each peer's order
  uint64_t dropped_ = 0, delayed_ = 0;
};

}  // namespace lockstep
