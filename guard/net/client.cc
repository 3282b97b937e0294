// client.cc — blocking client of the daemon's client port.
#include "guard/net/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <thread>

#include "guard/net/wire.h"

namespace lockstep {

bool SecretFor(const ClusterConfig& config, Principal as, std::string* secret, std::string* error) {
  switch (as) {
    case Principal::kClient: *secret = config.client_secret; break;
    case Principal::kAdmin: *secret = config.admin_secret; break;
    case Principal::kPeer:
    case Principal::kReplica: *secret = config.secret; break;
  }
  if (!secret->empty()) return true;
  const char* field = as == Principal::kClient  ? "client_secret"
                      : as == Principal::kAdmin ? "admin_secret"
                                                : "secret";
  *error = "this needs the " + std::string(PrincipalName(as)) + " credential, and " +
           (config.path.empty() ? std::string("the cluster's configuration") : config.path) +
           " has no '" + field + "' (a client's copy?)";
  return false;
}

std::unique_ptr<Client> Client::Connect(const ClusterConfig& config, int replica, int timeout_ms,
                                        std::string* error, Principal as, int own_id) {
  if (replica < 0 || replica >= static_cast<int>(config.replicas.size())) {
    *error = "no replica " + std::to_string(replica);
    return nullptr;
  }
  std::string secret;
  if (!SecretFor(config, as, &secret, error)) return nullptr;
  bool daemon = as == Principal::kReplica || as == Principal::kPeer;
  // assert: a daemon's request always names the replica it comes from.
  if (daemon && own_id < 0) {
    *error = "a replica's request without its replica id";
    return nullptr;
  }
  std::shared_ptr<TlsContext> tls = TlsContext::ForCluster(config, daemon ? own_id : -1, error);
  if (!tls) return nullptr;
  const auto& r = config.replicas[replica];
  auto s = ConnectAuthenticated(r.host, r.client_port, tls, replica, secret, as,
                                daemon ? own_id : 0, timeout_ms, error);
  if (!s) return nullptr;
  auto c = std::unique_ptr<Client>(new Client);
  c->stream_ = std::move(s);
  c->replica_ = replica;
  return c;
}

Client::~Client() = default;

bool Client::Await(FrameKind want, std::string* reply, int timeout_ms, std::string* error) {
  FrameKind kind;
  if (!ReadFrame(*stream_, &kind, reply, timeout_ms, error)) return false;
  if (kind == FrameKind::kRefused) {
    *error = "refused by replica " + std::to_string(replica_) + ": " + *reply;
    return false;
  }
  if (kind != want) {
    *error = "unexpected reply (a daemon of another version?)";
    return false;
  }
  return true;
}

bool Client::Ask(FrameKind kind, std::string_view body, FrameKind want, std::string* reply,
                 int timeout_ms, std::string* error) {
  return WriteFrame(*stream_, kind, body, error) && Await(want, reply, timeout_ms, error);
}

bool Client::SendPropose(EntryType type, std::string_view payload, std::string* error) {
  return WriteFrame(*stream_, FrameKind::kPropose, EncodeProposeRequest(type, payload), error);
}

bool Client::ReadProposeReply(ProposeReply* reply, std::string* error, int timeout_ms) {
  std::string body;
  if (!Await(FrameKind::kProposeResult, &body, timeout_ms, error)) return false;
  if (!DecodeProposeReply(body, reply)) {
    *error = "malformed reply";
    return false;
  }
  return true;
}

bool Client::Propose(EntryType type, std::string_view payload, ProposeReply* reply,
                     std::string* error, int timeout_ms) {
  return SendPropose(type, payload, error) && ReadProposeReply(reply, error, timeout_ms);
}

bool Client::Status(DaemonStatus* status, std::string* error, int timeout_ms) {
  std::string json, why;
  if (!Ask(FrameKind::kStatus, "", FrameKind::kStatusResult, &json, timeout_ms, error))
    return false;
  if (ParseDaemonStatus(json, status, &why)) return true;
  *error =
      "replica " + std::to_string(replica_) + " answered a status that is not readable: " + why;
  return false;
}

bool Client::Read(uint64_t from, uint32_t max, uint64_t* commit_index, std::vector<Entry>* entries,
                  std::string* error, int timeout_ms) {
  std::string body;
  if (!Ask(FrameKind::kRead, EncodeReadRequest(ReadRequest{from, max}), FrameKind::kReadResult,
           &body, timeout_ms, error))
    return false;
  ReadReply reply;
  if (!DecodeReadReply(body, &reply)) {
    *error = "malformed read reply";
    return false;
  }
  *commit_index = reply.commit_index;
  *entries = std::move(reply.entries);
  return true;
}

bool Client::Truncate(uint64_t below, uint64_t* first_index, std::string* error) {
  std::string body;
  if (!Ask(FrameKind::kTruncate, EncodeTruncateRequest(TruncateRequest{below}),
           FrameKind::kTruncateResult, &body, 5000, error))
    return false;
  TruncateReply reply;
  if (!DecodeTruncateReply(body, &reply)) {
    *error = "malformed reply";
    return false;
  }
  *first_index = reply.first_index;
  if (!reply.ok)
    *error = "cannot truncate below " + std::to_string(below) +
             " (beyond the commit index, or below the first entry kept)";
  return reply.ok;
}

bool Client::Failpoint(const std::string& spec, FailpointReply* reply, std::string* error) {
  std::string body;
  if (!Ask(FrameKind::kFailpoint, EncodeFailpointRequest(FailpointRequest{spec}),
           FrameKind::kFailpointResult, &body, 5000, error))
    return false;
  if (!DecodeFailpointReply(body, reply)) {
    *error = "malformed reply";
    return false;
  }
  return true;
}

bool Client::LeaderMove(int target, LeaderMoveReply* reply, std::string* error, int timeout_ms) {
  std::string body;
  if (!Ask(FrameKind::kLeaderMove, EncodeLeaderMoveRequest(LeaderMoveRequest{target}),
           FrameKind::kLeaderMoveResult, &body, timeout_ms, error))
    return false;
  if (!DecodeLeaderMoveReply(body, reply)) {
    *error = "malformed reply";
    return false;
  }
  return true;
}

bool Client::Inspect(const std::string& program, InspectReply* reply, std::string* error) {
  std::string body;
  // The daemon connects to its server first (5 s at most).
  if (!Ask(FrameKind::kInspect, EncodeInspectRequest(InspectRequest{program}),
           FrameKind::kInspectResult, &body, 10000, error))
    return false;
  if (!DecodeInspectReply(body, reply)) {
    *error = "malformed inspect reply (a daemon of another version?)";
    return false;
  }
  return true;
}

bool Client::Checkpoint(CheckpointOp op, CheckpointReply* reply, std::string* error) {
  std::string body;
  if (!Ask(FrameKind::kCheckpoint, EncodeCheckpointRequest(CheckpointRequest{op}),
           FrameKind::kCheckpointResult, &body, 10000, error))
    return false;
  if (!DecodeCheckpointReply(body, reply)) {
    *error = "malformed checkpoint reply (a daemon of another version?)";
    return false;
  }
  return true;
}

bool Client::Divergence(const DivergenceRequest& req, std::string* json, std::string* error) {
  return Ask(FrameKind::kDivergence, EncodeDivergenceRequest(req), FrameKind::kDivergenceResult,
             json, 10000, error);
}

bool Client::FetchCheckpoint(uint64_t min_index, const std::string& dest_dir, uint64_t* index,
                             uint64_t* bytes, std::string* error) {
  namespace fs = std::filesystem;
  *bytes = 0;
  std::error_code ec;
  if (!fs::create_directories(dest_dir, ec)) {
    *error = "cannot create " + dest_dir + ": " + (ec ? ec.message() : "it exists");
    return false;
  }
  if (!WriteFrame(*stream_, FrameKind::kFetchCheckpoint,
                  EncodeFetchCheckpointRequest(FetchCheckpointRequest{min_index}), error))
    return false;
  int out = -1;
  std::string open_path;
  auto close_out = [&] {
    if (out >= 0) close(out);
    out = -1;
  };
  for (;;) {
    FrameKind kind;
    std::string body;
    if (!ReadFrame(*stream_, &kind, &body, 30000, error)) {
      close_out();
      *error = "checkpoint transfer broke off: " + *error;
      return false;
    }
    if (kind == FrameKind::kRefused) {
      close_out();
      *error = "refused by replica " + std::to_string(replica_) + ": " + body;
      return false;
    }
    if (kind == FrameKind::kCheckpointDone) {
      close_out();
      CheckpointDone done;
      if (!DecodeCheckpointDone(body, &done)) {
        *error = "malformed end of the checkpoint transfer";
        return false;
      }
      if (!done.ok) *error = done.error;
      *index = done.index;
      return done.ok;
    }
    CheckpointPart part;
    if (kind != FrameKind::kCheckpointPart || !DecodeCheckpointPart(body, &part)) {
      close_out();
      *error = "malformed checkpoint part";
      return false;
    }
    // The peer names paths inside the checkpoint: nothing absolute, no "..".
    fs::path rel(part.path);
    bool safe = !part.path.empty() && rel.is_relative();
    for (const auto& c : rel) safe &= c != ".." && c != ".";
    // Nor through a symlink it sent before ("x" -> "/etc", then "x/passwd"): every
    // directory on the way must be a real one under dest_dir.
    fs::path walk(dest_dir);
    for (auto it = rel.begin(); safe && std::next(it) != rel.end(); ++it) {
      walk /= *it;
      safe = !fs::is_symlink(fs::symlink_status(walk, ec));
    }
    if (!safe) {
      close_out();
      *error = "the peer sent a path outside the checkpoint: " + part.path;
      return false;
    }
    // No checkpoint is this large: a made-up offset would make a huge sparse file.
    constexpr uint64_t kMaxCheckpointFileBytes = 256ull << 30;
    if (part.offset > kMaxCheckpointFileBytes ||
        part.bytes.size() > kMaxCheckpointFileBytes - part.offset) {
      close_out();
      *error = "the peer sent a part at offset " + std::to_string(part.offset) + " of " +
               part.path + ", beyond any checkpoint";
      return false;
    }
    fs::path dst = fs::path(dest_dir) / rel;
    fs::create_directories(dst.parent_path(), ec);
    if (part.symlink) {
      fs::create_symlink(part.bytes, dst, ec);
      if (ec) {
        *error = "cannot create " + dst.string() + ": " + ec.message();
        return false;
      }
      continue;
    }
    if (dst.string() != open_path) {
      close_out();
      // O_NOFOLLOW: never through a symlink the peer sent under this name.
      out = open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
      open_path = dst.string();
      // The sender's mode exactly (not narrowed by our umask).
      if (out < 0 || fchmod(out, part.mode) != 0) {
        *error = "cannot create " + dst.string() + ": " + strerror(errno);
        close_out();
        return false;
      }
    }
    if (pwrite(out, part.bytes.data(), part.bytes.size(), static_cast<off_t>(part.offset)) !=
        static_cast<ssize_t>(part.bytes.size())) {
      *error = "cannot write " + dst.string() + ": " + strerror(errno);
      close_out();
      return false;
    }
    *bytes += part.bytes.size();
  }
}

int FindLeader(const ClusterConfig& config, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  do {
    for (size_t r = 0; r < config.replicas.size(); r++) {
      std::string err;
      DaemonStatus st;
      auto c = Client::Connect(config, static_cast<int>(r), 200, &err);
      if (c && c->Status(&st, &err, 500) && st.role == "leader") return static_cast<int>(r);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } while (std::chrono::steady_clock::now() < deadline);
  return -1;
}

}  // namespace lockstep
