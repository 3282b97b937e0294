// inspection.h — `lockstep inspect`: the one way to read a replica's own
// server outside the log. An admin (admin_secret) asks the daemon over its
// TLS client port (kInspect, guard/net/wire.h); the daemon opens a TCP
// connection to its own server and relays bytes between the two
// (kInspectData frames on the TLS side).
//
// The shim serves such a connection on a replica that does not lead only
// because the daemon claimed it first: it binds the connection's local port,
// writes it into an inspection slot of the shim's region (shim_abi.h
// ls_inspect_slot) and then connects; the shim admits one connection from
// that address and port per claim, and closes any other connection a
// backup's server accepts. On a leader the connection is a client of its
// server like any other (its requests go through the log), so inspecting
// the leader writes nothing outside the log either. An inspection accepted
// on a backup dies once that replica leads (preload/shim_inspect.c).
//
// The profile may make inspection read-only (`inspect_commands`, redis's
// protocol): a request naming another command is answered with an error
// and never reaches the server. Without a list the relay passes bytes as
// they are. Every inspection is logged: who (principal, address, the
// program it ran), and what (the commands, with counts, and those refused;
// or the byte counts).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "guard/common/config.h"
#include "guard/common/replica_log.h"
#include "guard/net/tls.h"

namespace lockstep {

class ShimChannel;

// Splits a redis-protocol request stream (multibulk or inline) into
// requests and counts the server's complete replies (RESP2 and RESP3), so
// that a refused request's error is sent in its place among the replies.
class RespFilter {
 public:
  // list: "GET, DBSIZE, DEBUG DIGEST" (the profile's inspect_commands): one
  // word allows every subcommand, two words that subcommand only.
  explicit RespFilter(const std::string& list);

  enum class Verdict { kMore, kAllow, kRefuse, kSkip, kMalformed };
  // Looks at the request at the start of in: kMore (incomplete), or how
  // long it is (*len) and what to do with it: kAllow it, kRefuse it (*name:
  // its command, as refused), kSkip it (an empty inline line, which gets no
  // reply); kMalformed: not redis's protocol.
  Verdict Next(std::string_view in, size_t* len, std::string* name) const;
  // Counts complete replies in the server's bytes (fed in order); false
  // when they are not redis's protocol.
  bool FeedReplies(std::string_view out);
  uint64_t replies() const { return replies_; }

 private:
  bool Allowed(const std::vector<std::string>& words) const;
  // The end of the reply starting at pos of buf; std::string::npos when
  // incomplete; -2 (as size_t) when malformed.
  size_t ReplyEnd(size_t pos, int depth) const;
  std::vector<std::vector<std::string>> allowed_;
  std::string out_;  // server bytes since the last complete reply
  uint64_t replies_ = 0;
};

class Inspections {
 public:
  Inspections(const ClusterConfig& config, const ReplicaConfig& me, const ReplicaLog& log);
  ~Inspections();                           // ends every relay and waits for them
  static constexpr size_t kMaxRelays = 32;  // open at once: each holds two fds and a thread
  Inspections(const Inspections&) = delete;
  Inspections& operator=(const Inspections&) = delete;

  // On the daemon's loop: `client` (authenticated as `who` from `peer`, its
  // kInspect read) gets a relay to this replica's server. shim: the running
  // server's (null: none; the inspector is told so); leading: this replica
  // leads now (said in the reply and the log).
  void Serve(std::unique_ptr<Stream> client, const std::string& who, const std::string& peer,
             const std::string& program, ShimChannel* shim, bool leading);
  // On the loop, every pass: joins the relays that ended, revokes their
  // claims in the shim that runs now (if any) and only then closes their
  // server sockets. Until then each socket holds its address and port, so
  // a claim whose connection the shim never took (this replica led, or the
  // connect failed) cannot be used by anyone who binds the port after.
  void Reap(ShimChannel* shim);

 private:
  struct Relay {
    std::thread thread;
    std::atomic<bool> done{false};
    int server_fd = -1;  // closed by Reap, after the claim is revoked
    int port = 0;        // the claim's
  };
  // about: who, from where, running what; where: on a leader or a backup.
  void Run(int no, std::unique_ptr<Stream> client, int server_fd, std::string failed,
           std::string about, std::string where, Relay* self);

  const ClusterConfig& cfg_;
  const ReplicaConfig& me_;
  const ReplicaLog& log_;
  std::atomic<bool> stop_{false};
  int next_no_ = 1;
  std::vector<std::unique_ptr<Relay>> relays_;  // the loop's only
};

}  // namespace lockstep
