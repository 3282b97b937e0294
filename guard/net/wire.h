// wire.h — bytes on the daemons' TCP channels: framing, the protocol
// messages of consensus/core.h, the client requests and their replies (one
// encoder and one decoder each, shared by the daemon and the command-line
// client), and the handshake that authenticates every connection with its
// principal's secret (HMAC-SHA256 over a fresh challenge), inside the TLS
// that guard/net/tls.h puts under every connection: a process that knows no
// secret can neither speak for a replica nor propose, and one without the
// replica's certificate cannot be a peer.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "consensus/core.h"
#include "guard/common/conn_key.h"
#include "guard/common/metrics.h"
#include "guard/common/output_point.h"  // OutputPoint, SendStack
#include "guard/net/tls.h"

namespace lockstep {

// Frame kinds.
enum class FrameKind : uint8_t {
  kHello = 1,      // connector -> acceptor: role, from id
  kChallenge = 2,  // acceptor -> connector: 32-byte nonce
  kAuth = 3,       // connector -> acceptor: HMAC over the nonce
  kWelcome = 4,    // acceptor -> connector: authenticated
  kRefused = 5,    // acceptor -> connector: why (then close)
  kPeerMessage = 10,
  kPropose = 20,  // client -> daemon: type u8, payload
  kProposeResult = 21,
  kStatus = 22,  // client -> daemon: (empty) ; reply: JSON
  kStatusResult = 23,
  kRead = 24,  // client -> daemon: from u64, max u32 ; reply: entries
  kReadResult = 25,
  kTruncate = 26,  // client -> daemon: below u64
  kTruncateResult = 27,
  kCheckpoint = 28,  // client -> daemon: op u8 (CheckpointOp)
  kCheckpointResult = 29,
  // State transfer (guard/server/checkpoint_transfer.h): a replica asks a peer for
  // a checkpoint; the peer answers with parts, then done.
  kFetchCheckpoint = 30,  // min_index u64
  kCheckpointPart = 31,
  kCheckpointDone = 32,
  // Output checking (guard/output/output_guard.h), on the peers' connections.
  kOutputReport = 33,  // backup -> leader: digests of its server's output
  kRepairOrder = 34,   // leader -> a divergent backup: roll back (or fetch) and replay
  kRepairResult = 35,  // that backup -> leader: what the repair did
  // client -> daemon: the divergence reports this replica wrote.
  kDivergence = 36,  // op u8 (DivergenceOp), id
  kDivergenceResult = 37,
  // admin -> daemon: a failpoint spec (guard/daemon/failpoints.h); reply: ok, text.
  kFailpoint = 38,
  kFailpointResult = 39,
  // admin -> daemon: relay me to your own server (`lockstep inspect`,
  // guard/server/inspection.h); reply: ok, text. Then both ways
  // kInspectData frames: bytes of the connection, an empty one its end.
  kInspect = 40,
  kInspectResult = 41,
  kInspectData = 42,
  // admin -> the leader: move leadership (`lockstep leader move`); the reply
  // comes once the move is done or has failed.
  kLeaderMove = 43,  // target i32 (-1: the leader picks)
  kLeaderMoveResult = 44,
};
inline constexpr uint32_t kMaxFrame = 1u << 30;
// Before a connection has authenticated: HELLO and AUTH are a few dozen
// bytes; nobody unknown gets to make the daemon buffer more.
inline constexpr uint32_t kMaxHandshakeFrame = 4096;
inline constexpr uint32_t kWireMagic = 0x4c4b5354;  // "LKST"
inline constexpr uint32_t kWireVersion = 1;

class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { out_.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void f64(double v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool u8(uint8_t* v) { return raw(v, 1); }
  bool u32(uint32_t* v) { return raw(v, 4); }
  bool u64(uint64_t* v) { return raw(v, 8); }
  bool f64(double* v) { return raw(v, 8); }
  bool bytes(std::string* s) {
    uint32_t n;
    if (!u32(&n) || n > in_.size() - pos_) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool raw(void* v, size_t n) {
    if (in_.size() - pos_ < n) return false;
    memcpy(v, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::string_view in_;
  size_t pos_ = 0;
};

std::string EncodeMessage(const Message& m);
bool DecodeMessage(std::string_view in, Message* m);

// What a connection is for, on the daemon's side: a peer or a client that
// connected to us, or our own send-only connection to a peer.
enum class ConnRole : uint8_t { kPeer, kOutbound, kClient };
const char* ConnRoleName(ConnRole role);  // "peer", "outbound", "client"

// Who a connector says it is in its HELLO, which its proof covers. On the
// peer port: a peer (with its replica id). On the client port, each with a
// secret of its own (cluster.toml): a client may propose inputs, read the
// log, status and divergence reports (client_secret); an admin may also
// truncate the log, take checkpoints and fetch them (admin_secret); a
// replica is a daemon asking a peer for its status or its checkpoint (the
// replicas' own secret). Their names are the HELLO's role strings ("peer"
// and "client" as before this split): keep them.
enum class Principal : uint8_t { kPeer, kClient, kAdmin, kReplica };
const char* PrincipalName(Principal p);
bool ParsePrincipal(std::string_view name, Principal* p);  // false: none of the four
// The port a principal connects to.
inline ConnRole PortOf(Principal p) {
  return p == Principal::kPeer ? ConnRole::kPeer : ConnRole::kClient;
}

// The connector's first frame: who it is.
struct Hello {
  uint32_t magic = 0;  // kWireMagic
  uint32_t version = 0;
  std::string role;  // as sent (see ParsePrincipal)
  uint32_t from = 0;
};
std::string EncodeHello(Principal who, int from_id);
bool DecodeHello(std::string_view in, Hello* hello);  // false: truncated

std::string HmacSha256(const std::string& key, const std::string& data);
std::string RandomBytes(size_t n);
// What a connector proves: it knows its principal's secret, and who it is.
std::string AuthProof(const std::string& secret, const std::string& nonce, Principal who,
                      int from_id);

// Client requests (kPropose, kRead, kTruncate). Decoders check the layout
// only; what the values mean is the daemon's to check.
struct ProposeRequest {
  EntryType type = EntryType::kInput;
  std::string payload;
};
std::string EncodeProposeRequest(EntryType type, std::string_view payload);
bool DecodeProposeRequest(std::string_view in, ProposeRequest* req);

struct ReadRequest {
  uint64_t from = 0;  // first index wanted
  uint32_t max = 0;   // entries at most
};
std::string EncodeReadRequest(const ReadRequest& req);
bool DecodeReadRequest(std::string_view in, ReadRequest* req);

struct TruncateRequest {
  uint64_t below = 0;
};
std::string EncodeTruncateRequest(const TruncateRequest& req);
bool DecodeTruncateRequest(std::string_view in, TruncateRequest* req);

enum class CheckpointOp : uint8_t {
  kNow = 1,   // take a checkpoint as soon as the server is at rest (backups only)
  kList = 2,  // this replica's checkpoints, as a JSON array
};
struct CheckpointRequest {
  CheckpointOp op = CheckpointOp::kList;
};
std::string EncodeCheckpointRequest(const CheckpointRequest& req);
bool DecodeCheckpointRequest(std::string_view in, CheckpointRequest* req);

struct FailpointRequest {
  std::string spec;  // guard/daemon/failpoints.h; "off" clears
};
std::string EncodeFailpointRequest(const FailpointRequest& req);
bool DecodeFailpointRequest(std::string_view in, FailpointRequest* req);
struct FailpointReply {
  bool ok = false;
  std::string text;  // the spec now in force, or why not
};
std::string EncodeFailpointReply(const FailpointReply& reply);
bool DecodeFailpointReply(std::string_view in, FailpointReply* reply);

// An admin's membership change (`lockstep member`): the payload of a
// kPropose of type kConfig. The leader makes the kConfig entry itself
// (Replica::ProposeMembershipChange); the reply is the proposal's.
std::string EncodeMembershipRequest(const MembershipChange& change);
// "" when valid, else what is wrong (for the admin).
std::string DecodeMembershipRequest(std::string_view in, MembershipChange* change);

// kLeaderMove: the replica to lead next, or -1 for the furthest ready
// backup; the reply names the new leader, or says why there is none.
struct LeaderMoveRequest {
  int32_t target = -1;
};
std::string EncodeLeaderMoveRequest(const LeaderMoveRequest& req);
bool DecodeLeaderMoveRequest(std::string_view in, LeaderMoveRequest* req);
struct LeaderMoveReply {
  bool ok = false;
  int32_t new_leader = -1;  // ok: the replica the leader handed over to
  uint64_t waited_us = 0;   // from the request until the hand-over (or the failure)
  std::string text;         // why not, or what happened
};
std::string EncodeLeaderMoveReply(const LeaderMoveReply& reply);
bool DecodeLeaderMoveReply(std::string_view in, LeaderMoveReply* reply);

// kInspect: what the inspector runs (its command line, for the daemon's log
// of who inspected what); kInspectResult: whether the relay is open, and
// what it lets through (or why not).
struct InspectRequest {
  std::string program;  // "" for a plain byte relay (stdin/stdout)
};
std::string EncodeInspectRequest(const InspectRequest& req);
bool DecodeInspectRequest(std::string_view in, InspectRequest* req);
struct InspectReply {
  bool ok = false;
  std::string text;
};
std::string EncodeInspectReply(const InspectReply& reply);
bool DecodeInspectReply(std::string_view in, InspectReply* reply);

struct FetchCheckpointRequest {
  uint64_t min_index = 0;  // the checkpoint must hold at least the log up to here
};
std::string EncodeFetchCheckpointRequest(const FetchCheckpointRequest& req);
bool DecodeFetchCheckpointRequest(std::string_view in, FetchCheckpointRequest* req);

// Their replies (kProposeResult, kReadResult, kTruncateResult, kCheckpointResult,
// and a state transfer's kCheckpointPart... kCheckpointDone).
struct ProposeReply {
  bool ok = false;
  uint64_t index = 0;
  std::string error;
  // Only sent when ok:
  double commit_us = 0;   // daemon: proposal to commit
  double durable_us = 0;  // daemon: proposal to its own durable write
  double quorum_us = 0;   // daemon: durable write to commit (waiting for the majority)
};
std::string EncodeProposeReply(const ProposeReply& reply);
bool DecodeProposeReply(std::string_view in, ProposeReply* reply);

struct ReadReply {
  uint64_t commit_index = 0;
  std::vector<Entry> entries;  // committed, in index order
};
// Encodes from pointers into the daemon's log: the payloads are not copied twice.
std::string EncodeReadReply(uint64_t commit_index, const std::vector<const Entry*>& entries);
bool DecodeReadReply(std::string_view in, ReadReply* reply);

struct TruncateReply {
  bool ok = false;
  uint64_t first_index = 0;  // the log's first index after the request
};
std::string EncodeTruncateReply(const TruncateReply& reply);
bool DecodeTruncateReply(std::string_view in, TruncateReply* reply);

struct CheckpointReply {
  bool ok = false;
  std::string text;  // kList: the JSON array; otherwise why not, when !ok
};
std::string EncodeCheckpointReply(const CheckpointReply& reply);
bool DecodeCheckpointReply(std::string_view in, CheckpointReply* reply);

// One piece of a checkpoint's file (or a symlink: its target in bytes).
struct CheckpointPart {
  std::string path;  // relative to the checkpoint's dir ("MANIFEST", "img/pages-1.img")
  bool symlink = false;
  uint64_t offset = 0;
  std::string bytes;
  // The file's permission bits (0777 at most): CRIU refuses to restore an
  // open file whose mode differs from the dumped one's (MariaDB's 0660).
  uint32_t mode = 0644;
};
std::string EncodeCheckpointPart(const CheckpointPart& part);
bool DecodeCheckpointPart(std::string_view in, CheckpointPart* part);

struct CheckpointDone {
  bool ok = false;
  uint64_t index = 0;  // the checkpoint sent
  std::string error;   // why not ok
};
std::string EncodeCheckpointDone(const CheckpointDone& done);
bool DecodeCheckpointDone(std::string_view in, CheckpointDone* done);

// ---- Output checking: a backup's digests, the leader's repair order, and
// the backup's answer (guard/output/output_guard.h).
struct OutputReport {
  Ballot ballot = 0;        // the ballot of the leader it reports to
  uint64_t daemon_pid = 0;  // which run of the reporting daemon (a restart: another)
  std::vector<OutputPoint> points;
};
std::string EncodeOutputReport(const OutputReport& report);
bool DecodeOutputReport(std::string_view in, OutputReport* report);

enum class RepairHow : uint8_t {
  kRollback = 1,  // restore the newest own checkpoint at or below max_index, replay
  kTransfer = 2,  // fetch a checkpoint from a peer that agrees, replay
  // Change nothing: answer with the output around the place (a divergence
  // that recurs where no repair can mend it: the report shows both sides).
  kDescribe = 3,
};
const char* RepairHowName(RepairHow how);  // "rollback", "transfer", "describe"
struct RepairOrder {
  Ballot ballot = 0;
  std::string id;  // the divergence report's id
  RepairHow how = RepairHow::kRollback;
  uint64_t max_index = 0;  // kRollback: the newest checkpoint allowed
  ConnKey key;             // where it diverged: the backup keeps its output there
  uint64_t offset = 0;
  std::vector<int> agreeing;  // replicas that agreed with the leader there (kTransfer asks them)
  // kTransfer: the oldest checkpoint that will do, the entry where it
  // diverged: one from before holds the state the replay made differ (a
  // cloned start's image at 0 is always there to be sent). 0: any.
  uint64_t min_index = 0;
};
std::string EncodeRepairOrder(const RepairOrder& order);
bool DecodeRepairOrder(std::string_view in, RepairOrder* order);

struct RepairResult {
  std::string id;
  bool ok = false;
  std::string action;  // what was done, for people ("rolled back to checkpoint 40, ...")
  std::string error;   // why not ok
  uint64_t restored_index = 0;
  uint64_t restore_us = 0;  // taking the checkpoint back (and fetching it)
  uint64_t total_us = 0;    // from the order to the server in sync again
  // Its server's latest output on the connection, from the stream's byte
  // window_start on (taken before the repair).
  uint64_t window_start = 0;
  bool have_window = false;
  std::string window;
  std::vector<SendStack> sends;  // its server's last sends there, with their stacks
};
std::string EncodeRepairResult(const RepairResult& result);
bool DecodeRepairResult(std::string_view in, RepairResult* result);

enum class DivergenceOp : uint8_t {
  kList = 1,  // reply: a JSON array of report summaries
  kShow = 2,  // reply: the report as JSON ("" when this replica has no such report)
};
struct DivergenceRequest {
  DivergenceOp op = DivergenceOp::kList;
  std::string id;
};
std::string EncodeDivergenceRequest(const DivergenceRequest& req);
bool DecodeDivergenceRequest(std::string_view in, DivergenceRequest* req);

// A non-blocking TCP connection carrying frames, over TLS (its Stream).
// Owned by an event loop.
class FrameConn {
 public:
  FrameConn(std::unique_ptr<Stream> stream, ConnRole role)
      : role(role), fd_(stream->fd()), stream_(std::move(stream)) {}
  ~FrameConn();
  // The socket's number: the key the event loop knows it by (kept after
  // ReleaseStream, until the loop has forgotten it).
  int fd() const { return fd_; }
  Stream* stream() const { return stream_.get(); }
  // Gives the stream away (a checkpoint sender's thread takes it over); the
  // connection then reads and writes nothing.
  std::unique_ptr<Stream> ReleaseStream() { return std::move(stream_); }
  // Reads what the socket has; calls on_frame per complete frame. False when
  // the peer closed or the stream is malformed (error says why).
  bool ReadFrames(const std::function<void(FrameKind, std::string_view)>& on_frame,
                  std::string* error);
  void Queue(FrameKind kind, std::string_view body);
  // Writes what it can; false on a broken connection.
  bool Flush(std::string* error);
  // Bytes wait to be written, or TLS must write before it can read on.
  bool WantsWrite() const { return out_off_ < out_.size() || (stream_ && stream_->wants_write()); }
  size_t queued_bytes() const { return out_.size() - out_off_; }

  // Connection state used by the daemon.
  const ConnRole role;
  std::string close_after_read;  // non-empty: close once the frames read are handled
  bool authenticated = false;
  // The largest frame read from it, once authenticated (before: the
  // handshake's limit). FrontDoor lowers a client's and an admin's to what
  // their largest request, a proposal, may be.
  uint32_t frame_limit = kMaxFrame;
  std::string nonce;
  int peer_id = -1;
  Principal principal = Principal::kClient;  // who its HELLO said it is
  uint64_t opened_us = 0;                    // when it was accepted (handshake deadline)
  uint32_t proposals_waiting = 0;            // its proposals not yet answered (FrontDoor)
  int64_t checkpoint_from = -1;  // >= 0: handed to a checkpoint sender on close (that index on)
  bool inspect = false;          // handed to an inspection relay on close (FrontDoor)
  std::string inspect_program;   // what the inspector runs (InspectRequest)
  // Where the bytes read and written on it (frames, after TLS) are counted,
  // if anywhere (FrontDoor: the daemon's metrics).
  Counter* bytes_in = nullptr;
  Counter* bytes_out = nullptr;

 private:
  int fd_;
  std::unique_ptr<Stream> stream_;
  std::string in_;
  std::string out_;
  size_t out_off_ = 0;
};

// Blocking helpers for command-line clients and a daemon's own requests to
// its peers (a stream's socket may be non-blocking: they poll).
int ConnectTcp(const std::string& host, int port, int timeout_ms, std::string* error);
bool WriteFrame(Stream& s, FrameKind kind, std::string_view body, std::string* error);
bool ReadFrame(Stream& s, FrameKind* kind, std::string* body, int timeout_ms, std::string* error);
// Connects to replica `replica` at host:port over TLS (tls: the cluster's CA,
// and this replica's certificate when it has one), checks that the listener
// is that replica, and authenticates as `who` with that principal's secret.
std::unique_ptr<Stream> ConnectAuthenticated(const std::string& host, int port,
                                             const std::shared_ptr<TlsContext>& tls, int replica,
                                             const std::string& secret, Principal who, int from_id,
                                             int timeout_ms, std::string* error);

}  // namespace lockstep
