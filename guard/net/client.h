// client.h — the C++ client of a replica's client port: propose, read the
// committed log, status, truncate. The command-line tools and the benchmarks
// use it; every call is blocking with a timeout. A connection is made as one
// principal (wire.h): what the daemon refuses it (an admin's request from a
// client) comes back as an error saying so, and the connection stays.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "consensus/log_format.h"
#include "guard/common/config.h"
#include "guard/net/answers.h"  // DaemonStatus
#include "guard/net/wire.h"

namespace lockstep {

class Client {
 public:
  // Over TLS, checking that the listener holds `replica`'s certificate. A
  // daemon asking as Principal::kReplica gives its own id (own_id), and
  // presents that replica's certificate.
  static std::unique_ptr<Client> Connect(const ClusterConfig& config, int replica, int timeout_ms,
                                         std::string* error, Principal as = Principal::kClient,
                                         int own_id = -1);
  ~Client();
  int replica() const { return replica_; }
  bool Propose(EntryType type, std::string_view payload, ProposeReply* reply, std::string* error,
               int timeout_ms = 10000);
  // Pipelining: send now, collect replies in order later.
  bool SendPropose(EntryType type, std::string_view payload, std::string* error);
  bool ReadProposeReply(ProposeReply* reply, std::string* error, int timeout_ms = 10000);
  // The daemon's status, parsed; false when it did not answer or its answer
  // is not a JSON object (*error says which).
  bool Status(DaemonStatus* status, std::string* error, int timeout_ms = 2000);
  bool Read(uint64_t from, uint32_t max, uint64_t* commit_index, std::vector<Entry>* entries,
            std::string* error, int timeout_ms = 10000);
  bool Truncate(uint64_t below, uint64_t* first_index, std::string* error);
  // `lockstep failpoint` (admin): *reply says what is in force, or why not;
  // false only when the daemon did not answer.
  bool Failpoint(const std::string& spec, FailpointReply* reply, std::string* error);
  // `lockstep leader move` (admin, to the leader): target -1 lets the
  // leader pick. *reply says where leadership went, or why it did not
  // move; false only when the daemon did not answer (or refused: *error).
  bool LeaderMove(int target, LeaderMoveReply* reply, std::string* error, int timeout_ms = 10000);
  // `lockstep checkpoint now|list`: false only when the daemon did not answer.
  bool Checkpoint(CheckpointOp op, CheckpointReply* reply, std::string* error);
  // `lockstep divergence list|show`: the daemon's JSON; false only when it did not answer.
  bool Divergence(const DivergenceRequest& req, std::string* json, std::string* error);
  // `lockstep inspect` (admin): asks for a relay to the replica's own
  // server (guard/server/inspection.h); program: what the inspector runs,
  // for the replica's log. False only when the daemon did not answer (or
  // refused the request: *error says why). When reply->ok, the connection
  // carries kInspectData frames from here on: TakeStream has it.
  bool Inspect(const std::string& program, InspectReply* reply, std::string* error);
  std::unique_ptr<Stream> TakeStream() { return std::move(stream_); }
  // State transfer: receives the replica's newest checkpoint with index >=
  // min_index into dest_dir (which must not exist): its files as they are
  // on the replica's disk, MANIFEST included, unverified. The connection is
  // used up. *bytes: what was received.
  bool FetchCheckpoint(uint64_t min_index, const std::string& dest_dir, uint64_t* index,
                       uint64_t* bytes, std::string* error);

 private:
  // Sends one request and reads its reply, which must be of kind `want`;
  // a refusal (kRefused) is an error that says why.
  bool Ask(FrameKind kind, std::string_view body, FrameKind want, std::string* reply,
           int timeout_ms, std::string* error);
  // Reads one reply of kind `want` (or a refusal, as above).
  bool Await(FrameKind want, std::string* reply, int timeout_ms, std::string* error);
  std::unique_ptr<Stream> stream_;
  int replica_ = -1;
};

// The secret that proves principal `as` from this config; false (error:
// what is missing) when a client's copy of cluster.toml does not hold it.
bool SecretFor(const ClusterConfig& config, Principal as, std::string* secret, std::string* error);
// Asks every replica; returns the id of the one that says it leads, or -1.
int FindLeader(const ClusterConfig& config, int timeout_ms);

}  // namespace lockstep
