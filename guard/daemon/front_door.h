// front_door.h — the replica's TCP side: the peer and client listeners, the
// thread that opens (and re-opens) the send-only connection to every peer,
// the authentication handshake every connection passes first, and then its
// frames: protocol messages from peers, and client requests (propose,
// status, read, truncate), whose proposals wait here until they commit, and
// an admin's leader move, which waits here until the hand-over.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "consensus/core.h"
#include "guard/common/config.h"
#include "guard/common/event_loop.h"
#include "guard/common/json.h"
#include "guard/common/metrics.h"
#include "guard/common/replica_log.h"
#include "guard/net/tls_acceptor.h"
#include "guard/net/wire.h"

namespace lockstep {

// What the status reply says about the replicated server (zeros without one).
struct ServerStatus {
  uint64_t applied_index = 0;
  bool server_read_all = true;  // its server has read every input handed to it
  int server_pid = 0;
  size_t replay_connections = 0;
  Json checkpoint_json;                        // ServerPipeline::CheckpointStatusJson (null: none)
  Json output_json;                            // OutputGuard::StatusJson
  Json state_json;                             // StateChecker::StatusJson
  uint64_t lease_reads = 0, lease_misses = 0;  // ServerPipeline's
  bool serving = false;                        // this replica leads and its server serves clients
};

class FrontDoor {
 public:
  struct Hooks {
    // An authenticated peer's message to this replica.
    std::function<void(Message)> on_peer_message;
    // Fills an outgoing message's transport blob; false: do not send it.
    std::function<bool(Message*)> fill_transport;
    std::function<ServerStatus()> server_status;
    std::function<CheckpointReply(CheckpointOp)> checkpoint;
    // Takes a connection (authenticated; its kFetchCheckpoint read) and sends
    // a checkpoint over it.
    std::function<void(std::unique_ptr<Stream>, uint64_t min_index)> serve_checkpoint;
    // An authenticated peer's frame of another kind than a protocol message
    // (output checking: kOutputReport, kRepairOrder, kRepairResult).
    std::function<void(int from, FrameKind kind, std::string_view body)> on_peer_frame;
    // kDivergence: the reply's JSON ("" when a report asked for is not here).
    std::function<std::string(const DivergenceRequest&)> divergence;
    // Takes a connection (an admin's, its kInspect read) and relays it to
    // this replica's server (guard/server/inspection.h): who, from where.
    std::function<void(std::unique_ptr<Stream>, const std::string& who, const std::string& peer,
                       const std::string& program)>
        serve_inspection;
    // kFailpoint (an admin's): sets the spec; the reply says what is in force.
    std::function<FailpointReply(const std::string& spec)> failpoint;
  };

  // disk_error: non-empty while this replica cannot write its log (then
  // proposals are refused); owned by the caller and read on every proposal.
  FrontDoor(const ClusterConfig& config, int id, bool verbose, EventLoop& loop, Replica& core,
            const std::string& disk_error, Hooks hooks, const ReplicaLog& log);
  ~FrontDoor();  // stops the connector thread
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  // Listens on the peer and client ports (false, logged, when it cannot).
  bool Listen();
  // The daemon appended replicas to cfg_.replicas (a member added through
  // the log): connect to them and accept them from now on. Loop thread.
  void KnowReplicas(int replicas) { n_ = std::max(n_.load(), replicas); }
  // Starts the thread that connects to the peers; StopConnector joins it.
  void StartConnector();
  void StopConnector();

  // Over the outbound connection to m->to; dropped when there is none (the
  // protocol tolerates a lost message).
  void SendToPeer(Message* m);
  // Any other frame to a peer, the same way (false: not connected).
  bool SendFrameToPeer(int to, FrameKind kind, std::string_view body);
  // Answers the proposals whose index committed (or was decided otherwise).
  void ReplyWaiters(uint64_t now);
  // Answers every proposal in flight: outcome unknown, because `why`.
  void FailWaiters(const std::string& why);
  // Answers the admin's leader move once the core's transfer has ended
  // (Replica::transfer): handed over, or why not.
  void ReplyLeaderMove(uint64_t now);
  // Writes what client connections have queued.
  void FlushClients();
  // Closes connections that have not authenticated within kHandshakeUs.
  void ExpireHandshakes(uint64_t now);

  // For the daemon's metrics (daemon_metrics.h): where each connection
  // counts its bytes (by port: client or peer, in and out; set before
  // Listen), and how many clients are connected and failed to come in.
  struct ByteCounters {
    Counter* client_in = nullptr;
    Counter* client_out = nullptr;
    Counter* peer_in = nullptr;
    Counter* peer_out = nullptr;
  };
  void CountBytes(const ByteCounters& counters) { byte_counters_ = counters; }
  size_t client_connections() const;       // authenticated, on the client port
  uint64_t tls_handshakes_failed() const;  // closed before their TLS was up (TlsAcceptor)
  uint64_t handshakes_dropped() const { return handshakes_dropped_; }  // TLS up, not authenticated

  // Limits before authentication (besides kMaxHandshakeFrame, wire.h): the
  // time a connection has to authenticate, and how many may be at it at
  // once on each port (the oldest of that port is dropped for a newcomer, so
  // that a flood of idle connections cannot lock the replica's own clients
  // out, nor, on the client port, its peers).
  static constexpr uint64_t kHandshakeUs = 5000000;
  static constexpr size_t kMaxHandshaking = 64;
  // Limits after authentication: proposals of one connection waiting for
  // their commit, and entries of the log not yet committed (a leader without
  // a majority that keeps up would otherwise hold every proposal in memory,
  // without bound). Each refusal says which, and nothing refused is logged.
  static constexpr uint32_t kMaxProposalsWaiting = 4096;
  static constexpr uint64_t kMaxUncommitted = 65536;
  // A read's reply holds entries up to this many payload bytes (at least
  // one entry; clients page on), and a client that lets more than
  // kMaxQueuedReplyBytes of replies pile up unread is disconnected.
  static constexpr uint64_t kMaxReadReplyBytes = 16u << 20;
  static constexpr size_t kMaxQueuedReplyBytes = 64u << 20;
  // Authenticated connections on the client port at once: each holds an fd
  // and buffers, and a daemon out of fds can accept neither peers nor its
  // server's replay connections. A client past it is refused, saying so.
  static constexpr size_t kMaxClientConns = 256;
  // A leader move (`lockstep leader move`): how long the target has to
  // catch up before the leader gives up and serves again, and how long the
  // old leader then stands for no election. No hold: the target runs at
  // once and wins long before the old leader's election timer fires, and
  // one that cannot take over is replaced by whoever wins next, the old
  // leader included; a hold would also make the old leader refuse the
  // take-over of a move back to it soon after (moves 500 ms apart with a
  // 500 ms hold: the second waited out an election, 88-406 ms).
  static constexpr uint64_t kLeaderMoveTimeoutUs = 1000000;
  static constexpr uint64_t kLeaderMoveHoldUs = 0;

 private:
  // A client's proposal, answered once its index commits.
  struct Waiter {
    uint64_t index;
    Ballot ballot;
    uint64_t proposed_us;
    uint64_t durable_us = 0;
    FrameConn* conn;  // null once the client left
  };
  void ConnectorThread();
  bool OnOutboundConnected();
  bool OnAccepted();
  void AddConn(std::unique_ptr<FrameConn> c);
  bool OnConnEvent(int fd, uint32_t events);
  void OnConnReadable(FrameConn* c);
  void CloseConn(FrameConn* c, const std::string& why);
  void OnFrame(FrameConn* c, FrameKind kind, std::string_view body);
  void OnHandshake(FrameConn* c, FrameKind kind, std::string_view body);
  void OnClientFrame(FrameConn* c, FrameKind kind, std::string_view body);
  void OnPropose(FrameConn* c, std::string_view body, uint64_t now);
  void OnLeaderMove(FrameConn* c, std::string_view body, uint64_t now);
  std::string StatusJson();

  const ClusterConfig& cfg_;
  const ReplicaConfig& me_;
  // Replicas 0..n_-1 have addresses (cfg_.replicas; the daemon appends to
  // it, capacity reserved, and then raises n_: KnowReplicas). The connector
  // thread reads it too.
  std::atomic<int> n_;
  bool verbose_;
  EventLoop& loop_;
  Replica& core_;
  const std::string& disk_error_;
  Hooks hooks_;
  const ReplicaLog& log_;

  std::shared_ptr<TlsContext> tls_;  // this replica's certificate and the cluster's CA
  int peer_listen_ = -1, client_listen_ = -1;
  std::unique_ptr<TlsAcceptor> acceptor_;            // accepts on both, brings their TLS up
  std::map<int, std::unique_ptr<FrameConn>> conns_;  // by fd
  uint64_t next_handshake_sweep_us_ = 0;
  uint64_t handshakes_dropped_ = 0;  // closed before authenticating (logged sparingly)
  ByteCounters byte_counters_;
  void DropHandshake(FrameConn* c, const std::string& why);
  void Refuse(FrameConn* c, const std::string& why);
  bool Permit(FrameConn* c, std::initializer_list<Principal> allowed, const char* what);
  std::vector<FrameConn*> outbound_;  // by replica id
  std::deque<Waiter> waiters_;        // in index order
  // The admin's leader move in progress (its connection null once it left).
  struct MoveWaiter {
    bool active = false;
    FrameConn* conn = nullptr;
    int target = -1;
    uint64_t asked_us = 0;
  };
  MoveWaiter move_;

  // Shared with the connector thread.
  std::mutex connected_mu_;
  // (replica, authenticated stream) from the connector thread
  std::vector<std::pair<int, std::unique_ptr<Stream>>> connected_;
  int connected_efd_ = -1;  // wakes the loop to take them
  std::unique_ptr<std::atomic<bool>[]> outbound_connected_;
  std::atomic<bool> stopping_{false};
  std::thread connector_;
};

}  // namespace lockstep
