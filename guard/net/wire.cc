// wire.cc — framing, message encoding and the authentication handshake.
#include "guard/net/wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

namespace lockstep {

std::string EncodeMessage(const Message& m) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(m.type));
  w.u32(static_cast<uint32_t>(m.from));
  w.u32(static_cast<uint32_t>(m.to));
  w.u64(m.ballot);
  w.u64(m.stream_id);
  w.u64(m.commit_index);
  w.u64(m.sent_pos);
  w.u64(m.promised);
  w.u64(m.handed_over);
  w.u8(m.granted ? 1 : 0);
  w.u32(static_cast<uint32_t>(m.entries.size()));
  for (const Entry& e : m.entries) {
    w.u64(e.index);
    w.u64(e.ballot);
    w.u8(static_cast<uint8_t>(e.type));
    w.bytes(e.payload);
  }
  w.bytes(m.transport);
  return std::move(w.str());
}

bool DecodeMessage(std::string_view in, Message* m) {
  ByteReader r(in);
  uint8_t type, granted;
  uint32_t from, to, n;
  if (!r.u8(&type) || !r.u32(&from) || !r.u32(&to) || !r.u64(&m->ballot) || !r.u64(&m->stream_id) ||
      !r.u64(&m->commit_index) || !r.u64(&m->sent_pos) || !r.u64(&m->promised) ||
      !r.u64(&m->handed_over) || !r.u8(&granted) || !r.u32(&n))
    return false;
  if (type < 1 || type >= Message::kTypes || from >= kMaxMemberIds || to >= kMaxMemberIds)
    return false;
  m->granted = granted != 0;
  m->type = static_cast<Message::Type>(type);
  m->from = static_cast<int>(from);
  m->to = static_cast<int>(to);
  m->entries.clear();
  for (uint32_t i = 0; i < n; i++) {
    Entry e;
    uint8_t t;
    if (!r.u64(&e.index) || !r.u64(&e.ballot) || !r.u8(&t) || !r.bytes(&e.payload)) return false;
    e.type = static_cast<EntryType>(t);
    if (!IsSlotType(e.type)) return false;
    m->entries.push_back(std::move(e));
  }
  return r.bytes(&m->transport) && r.done();
}

const char* ConnRoleName(ConnRole role) {
  switch (role) {
    case ConnRole::kPeer: return "peer";
    case ConnRole::kOutbound: return "outbound";
    case ConnRole::kClient: return "client";
  }
  return "?";
}

const char* PrincipalName(Principal p) {
  switch (p) {
    case Principal::kPeer: return "peer";
    case Principal::kClient: return "client";
    case Principal::kAdmin: return "admin";
    case Principal::kReplica: return "replica";
  }
  return "?";
}

bool ParsePrincipal(std::string_view name, Principal* p) {
  for (Principal q :
       {Principal::kPeer, Principal::kClient, Principal::kAdmin, Principal::kReplica}) {
    if (name == PrincipalName(q)) {
      *p = q;
      return true;
    }
  }
  return false;
}

std::string EncodeHello(Principal who, int from_id) {
  ByteWriter w;
  w.u32(kWireMagic);
  w.u32(kWireVersion);
  w.bytes(PrincipalName(who));
  w.u32(static_cast<uint32_t>(from_id));
  return std::move(w.str());
}

bool DecodeHello(std::string_view in, Hello* hello) {
  ByteReader r(in);
  return r.u32(&hello->magic) && r.u32(&hello->version) && r.bytes(&hello->role) &&
         r.u32(&hello->from);
}

// ---------------------------------------------------------------- client requests

std::string EncodeProposeRequest(EntryType type, std::string_view payload) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(type));
  w.bytes(payload);
  return std::move(w.str());
}

bool DecodeProposeRequest(std::string_view in, ProposeRequest* req) {
  ByteReader r(in);
  uint8_t type = 0;
  if (!r.u8(&type) || !r.bytes(&req->payload)) return false;
  req->type = static_cast<EntryType>(type);
  return true;
}

std::string EncodeReadRequest(const ReadRequest& req) {
  ByteWriter w;
  w.u64(req.from);
  w.u32(req.max);
  return std::move(w.str());
}

bool DecodeReadRequest(std::string_view in, ReadRequest* req) {
  ByteReader r(in);
  return r.u64(&req->from) && r.u32(&req->max);
}

std::string EncodeTruncateRequest(const TruncateRequest& req) {
  ByteWriter w;
  w.u64(req.below);
  return std::move(w.str());
}

bool DecodeTruncateRequest(std::string_view in, TruncateRequest* req) {
  ByteReader r(in);
  return r.u64(&req->below);
}

std::string EncodeCheckpointRequest(const CheckpointRequest& req) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(req.op));
  return std::move(w.str());
}

bool DecodeCheckpointRequest(std::string_view in, CheckpointRequest* req) {
  ByteReader r(in);
  uint8_t op = 0;
  if (!r.u8(&op) || !r.done()) return false;
  if (op != static_cast<uint8_t>(CheckpointOp::kNow) &&
      op != static_cast<uint8_t>(CheckpointOp::kList))
    return false;
  req->op = static_cast<CheckpointOp>(op);
  return true;
}

std::string EncodeFetchCheckpointRequest(const FetchCheckpointRequest& req) {
  ByteWriter w;
  w.u64(req.min_index);
  return std::move(w.str());
}

bool DecodeFetchCheckpointRequest(std::string_view in, FetchCheckpointRequest* req) {
  ByteReader r(in);
  return r.u64(&req->min_index) && r.done();
}

// ---------------------------------------------------------------- client replies

std::string EncodeProposeReply(const ProposeReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.u64(reply.index);
  w.bytes(reply.error);
  if (reply.ok) {
    w.f64(reply.commit_us);
    w.f64(reply.durable_us);
    w.f64(reply.quorum_us);
  }
  return std::move(w.str());
}

bool DecodeProposeReply(std::string_view in, ProposeReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  *reply = ProposeReply{};
  if (!r.u8(&ok) || !r.u64(&reply->index) || !r.bytes(&reply->error)) return false;
  reply->ok = ok != 0;
  if (reply->ok) {  // timings are informative: a reply without them still counts
    r.f64(&reply->commit_us);
    r.f64(&reply->durable_us);
    r.f64(&reply->quorum_us);
  }
  return true;
}

std::string EncodeReadReply(uint64_t commit_index, const std::vector<const Entry*>& entries) {
  ByteWriter w;
  w.u64(commit_index);
  w.u32(static_cast<uint32_t>(entries.size()));
  for (const Entry* e : entries) {
    w.u64(e->index);
    w.u64(e->ballot);
    w.u8(static_cast<uint8_t>(e->type));
    w.bytes(e->payload);
  }
  return std::move(w.str());
}

bool DecodeReadReply(std::string_view in, ReadReply* reply) {
  ByteReader r(in);
  uint32_t n = 0;
  reply->entries.clear();
  if (!r.u64(&reply->commit_index) || !r.u32(&n)) return false;
  for (uint32_t i = 0; i < n; i++) {
    Entry e;
    uint8_t t;
    if (!r.u64(&e.index) || !r.u64(&e.ballot) || !r.u8(&t) || !r.bytes(&e.payload)) return false;
    e.type = static_cast<EntryType>(t);
    reply->entries.push_back(std::move(e));
  }
  return true;
}

std::string EncodeTruncateReply(const TruncateReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.u64(reply.first_index);
  return std::move(w.str());
}

bool DecodeTruncateReply(std::string_view in, TruncateReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  if (!r.u8(&ok) || !r.u64(&reply->first_index)) return false;
  reply->ok = ok != 0;
  return true;
}

std::string EncodeCheckpointReply(const CheckpointReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.bytes(reply.text);
  return std::move(w.str());
}

bool DecodeCheckpointReply(std::string_view in, CheckpointReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  if (!r.u8(&ok) || !r.bytes(&reply->text)) return false;
  reply->ok = ok != 0;
  return true;
}

std::string EncodeFailpointRequest(const FailpointRequest& req) {
  ByteWriter w;
  w.bytes(req.spec);
  return std::move(w.str());
}

bool DecodeFailpointRequest(std::string_view in, FailpointRequest* req) {
  ByteReader r(in);
  return r.bytes(&req->spec) && r.done();
}

std::string EncodeFailpointReply(const FailpointReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.bytes(reply.text);
  return std::move(w.str());
}

bool DecodeFailpointReply(std::string_view in, FailpointReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  if (!r.u8(&ok) || !r.bytes(&reply->text) || !r.done()) return false;
  reply->ok = ok != 0;
  return true;
}

std::string EncodeLeaderMoveRequest(const LeaderMoveRequest& req) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(req.target));
  return std::move(w.str());
}

std::string EncodeMembershipRequest(const MembershipChange& change) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(change.kind));
  w.u32(static_cast<uint32_t>(change.id));
  return std::move(w.str());
}

std::string DecodeMembershipRequest(std::string_view in, MembershipChange* change) {
  ByteReader r(in);
  uint8_t kind = 0;
  uint32_t id = 0;
  if (!r.u8(&kind) || !r.u32(&id) || !r.done()) return "malformed membership change request";
  if (kind < static_cast<uint8_t>(MembershipChangeKind::kAddLearner) ||
      kind > static_cast<uint8_t>(MembershipChangeKind::kRemove))
    return "unknown membership change " + std::to_string(kind);
  if (id >= static_cast<uint32_t>(kMaxMemberIds))
    return "replica id " + std::to_string(id) + " out of range (0.." +
           std::to_string(kMaxMemberIds - 1) + ")";
  change->kind = static_cast<MembershipChangeKind>(kind);
  change->id = static_cast<int>(id);
  return "";
}

bool DecodeLeaderMoveRequest(std::string_view in, LeaderMoveRequest* req) {
  ByteReader r(in);
  uint32_t target = 0;
  if (!r.u32(&target) || !r.done()) return false;
  req->target = static_cast<int32_t>(target);
  return true;
}

std::string EncodeLeaderMoveReply(const LeaderMoveReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.u32(static_cast<uint32_t>(reply.new_leader));
  w.u64(reply.waited_us);
  w.bytes(reply.text);
  return std::move(w.str());
}

bool DecodeLeaderMoveReply(std::string_view in, LeaderMoveReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  uint32_t leader = 0;
  if (!r.u8(&ok) || !r.u32(&leader) || !r.u64(&reply->waited_us) || !r.bytes(&reply->text) ||
      !r.done())
    return false;
  reply->ok = ok != 0;
  reply->new_leader = static_cast<int32_t>(leader);
  return true;
}

std::string EncodeInspectRequest(const InspectRequest& req) {
  ByteWriter w;
  w.bytes(req.program);
  return std::move(w.str());
}

bool DecodeInspectRequest(std::string_view in, InspectRequest* req) {
  ByteReader r(in);
  return r.bytes(&req->program) && r.done();
}

std::string EncodeInspectReply(const InspectReply& reply) {
  ByteWriter w;
  w.u8(reply.ok ? 1 : 0);
  w.bytes(reply.text);
  return std::move(w.str());
}

bool DecodeInspectReply(std::string_view in, InspectReply* reply) {
  ByteReader r(in);
  uint8_t ok = 0;
  if (!r.u8(&ok) || !r.bytes(&reply->text) || !r.done()) return false;
  reply->ok = ok != 0;
  return true;
}

std::string EncodeCheckpointPart(const CheckpointPart& part) {
  ByteWriter w;
  w.bytes(part.path);
  w.u8(part.symlink ? 1 : 0);
  w.u64(part.offset);
  w.bytes(part.bytes);
  w.u32(part.mode);
  return std::move(w.str());
}

bool DecodeCheckpointPart(std::string_view in, CheckpointPart* part) {
  ByteReader r(in);
  uint8_t link = 0;
  if (!r.bytes(&part->path) || !r.u8(&link) || !r.u64(&part->offset) || !r.bytes(&part->bytes) ||
      !r.u32(&part->mode) || !r.done() || part->mode > 0777)
    return false;
  part->symlink = link != 0;
  return true;
}

std::string EncodeCheckpointDone(const CheckpointDone& done) {
  ByteWriter w;
  w.u8(done.ok ? 1 : 0);
  w.u64(done.index);
  w.bytes(done.error);
  return std::move(w.str());
}

bool DecodeCheckpointDone(std::string_view in, CheckpointDone* done) {
  ByteReader r(in);
  uint8_t ok = 0;
  if (!r.u8(&ok) || !r.u64(&done->index) || !r.bytes(&done->error) || !r.done()) return false;
  done->ok = ok != 0;
  return true;
}

// ---------------------------------------------------------------- output checking

namespace {
constexpr uint32_t kMaxReportPoints = 1u << 20;
void PutKey(ByteWriter* w, const ConnKey& k) {
  w->u64(k.ballot);
  w->u32(k.no);
}
bool GetKey(ByteReader* r, ConnKey* k) {
  return r->u64(&k->ballot) && r->u32(&k->no);
}
}  // namespace

// An output point's flags byte.
constexpr uint8_t kPointMark = 1, kPointEnded = 2;

std::string EncodeOutputReport(const OutputReport& report) {
  ByteWriter w;
  w.u64(report.ballot);
  w.u64(report.daemon_pid);
  w.u32(static_cast<uint32_t>(report.points.size()));
  for (const OutputPoint& p : report.points) {
    PutKey(&w, p.key);
    w.u64(p.offset);
    w.u64(p.digest);
    w.u64(p.applied);
    w.u8((p.mark ? kPointMark : 0) | (p.ended ? kPointEnded : 0));
  }
  return std::move(w.str());
}

bool DecodeOutputReport(std::string_view in, OutputReport* report) {
  ByteReader r(in);
  uint32_t n = 0;
  if (!r.u64(&report->ballot) || !r.u64(&report->daemon_pid) || !r.u32(&n) || n > kMaxReportPoints)
    return false;
  report->points.clear();
  for (uint32_t i = 0; i < n; i++) {
    OutputPoint p;
    uint8_t flags = 0;
    if (!GetKey(&r, &p.key) || !r.u64(&p.offset) || !r.u64(&p.digest) || !r.u64(&p.applied) ||
        !r.u8(&flags) || (flags & ~(kPointMark | kPointEnded)))
      return false;
    p.mark = flags & kPointMark;
    p.ended = flags & kPointEnded;
    report->points.push_back(p);
  }
  return r.done();
}

const char* RepairHowName(RepairHow how) {
  switch (how) {
    case RepairHow::kRollback: return "rollback";
    case RepairHow::kTransfer: return "transfer";
    case RepairHow::kDescribe: return "describe";
  }
  return "unknown";
}

std::string EncodeRepairOrder(const RepairOrder& order) {
  ByteWriter w;
  w.u64(order.ballot);
  w.bytes(order.id);
  w.u8(static_cast<uint8_t>(order.how));
  w.u64(order.max_index);
  PutKey(&w, order.key);
  w.u64(order.offset);
  w.u32(static_cast<uint32_t>(order.agreeing.size()));
  for (int r : order.agreeing) w.u32(static_cast<uint32_t>(r));
  w.u64(order.min_index);
  return std::move(w.str());
}

bool DecodeRepairOrder(std::string_view in, RepairOrder* order) {
  ByteReader r(in);
  uint8_t how = 0;
  uint32_t n = 0;
  if (!r.u64(&order->ballot) || !r.bytes(&order->id) || !r.u8(&how) || !r.u64(&order->max_index) ||
      !GetKey(&r, &order->key) || !r.u64(&order->offset) || !r.u32(&n) ||
      n > static_cast<uint32_t>(kMaxMemberIds))
    return false;
  if (how != static_cast<uint8_t>(RepairHow::kRollback) &&
      how != static_cast<uint8_t>(RepairHow::kTransfer) &&
      how != static_cast<uint8_t>(RepairHow::kDescribe))
    return false;
  order->how = static_cast<RepairHow>(how);
  order->agreeing.clear();
  for (uint32_t i = 0; i < n; i++) {
    uint32_t v = 0;
    if (!r.u32(&v) || v >= static_cast<uint32_t>(kMaxMemberIds)) return false;
    order->agreeing.push_back(static_cast<int>(v));
  }
  if (!r.u64(&order->min_index)) return false;
  return r.done();
}

std::string EncodeRepairResult(const RepairResult& result) {
  ByteWriter w;
  w.bytes(result.id);
  w.u8(result.ok ? 1 : 0);
  w.bytes(result.action);
  w.bytes(result.error);
  w.u64(result.restored_index);
  w.u64(result.restore_us);
  w.u64(result.total_us);
  w.u64(result.window_start);
  w.u8(result.have_window ? 1 : 0);
  w.bytes(result.window);
  w.u32(static_cast<uint32_t>(result.sends.size()));
  for (const SendStack& s : result.sends) {
    w.u64(s.start);
    w.u64(s.end);
    w.bytes(s.frames);
  }
  return std::move(w.str());
}

bool DecodeRepairResult(std::string_view in, RepairResult* result) {
  ByteReader r(in);
  uint8_t ok = 0, have = 0;
  if (!r.bytes(&result->id) || !r.u8(&ok) || !r.bytes(&result->action) ||
      !r.bytes(&result->error) || !r.u64(&result->restored_index) || !r.u64(&result->restore_us) ||
      !r.u64(&result->total_us) || !r.u64(&result->window_start) || !r.u8(&have) ||
      !r.bytes(&result->window))
    return false;
  uint32_t sends = 0;
  if (!r.u32(&sends) || sends > 64) return false;
  result->sends.resize(sends);
  for (SendStack& s : result->sends)
    if (!r.u64(&s.start) || !r.u64(&s.end) || !r.bytes(&s.frames)) return false;
  if (!r.done()) return false;
  result->ok = ok != 0;
  result->have_window = have != 0;
  return true;
}

std::string EncodeDivergenceRequest(const DivergenceRequest& req) {
  ByteWriter w;
  w.u8(static_cast<uint8_t>(req.op));
  w.bytes(req.id);
  return std::move(w.str());
}

bool DecodeDivergenceRequest(std::string_view in, DivergenceRequest* req) {
  ByteReader r(in);
  uint8_t op = 0;
  if (!r.u8(&op) || !r.bytes(&req->id) || !r.done()) return false;
  if (op != static_cast<uint8_t>(DivergenceOp::kList) &&
      op != static_cast<uint8_t>(DivergenceOp::kShow))
    return false;
  req->op = static_cast<DivergenceOp>(op);
  return true;
}

// ---------------------------------------------------------------- authentication

std::string HmacSha256(const std::string& key, const std::string& data) {
  unsigned char out[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), static_cast<int>(n)) != 1) {
    // Never fall back to a predictable nonce.
    fprintf(stderr, "lockstep: RAND_bytes failed\n");
    abort();
  }
  return s;
}

std::string AuthProof(const std::string& secret, const std::string& nonce, Principal who,
                      int from_id) {
  return HmacSha256(secret, "lockstep-auth-v1|" + std::string(PrincipalName(who)) + "|" +
                                std::to_string(from_id) + "|" + nonce);
}

FrameConn::~FrameConn() = default;

bool FrameConn::ReadFrames(const std::function<void(FrameKind, std::string_view)>& on_frame,
                           std::string* error) {
  if (!stream_) return true;  // given away
  char buf[65536];
  for (;;) {
    ssize_t n = stream_->Read(buf, sizeof buf);
    if (n > 0) {
      in_.append(buf, n);
      if (bytes_in) bytes_in->Add(static_cast<uint64_t>(n));
      // A short read took what the socket had, unless TLS holds more than
      // it handed out (the socket would not signal those bytes again).
      if (static_cast<size_t>(n) < sizeof buf && !stream_->has_buffered()) break;
      if (!authenticated && in_.size() > 2 * kMaxHandshakeFrame) break;  // judged below
      continue;
    }
    if (n == 0) {
      *error = "connection closed by peer";
      return false;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    *error = stream_->error().empty() ? std::string("read: ") + strerror(errno) : stream_->error();
    return false;
  }
  size_t off = 0;
  while (in_.size() - off >= 5) {
    uint32_t len;
    memcpy(&len, in_.data() + off, 4);
    if (len > frame_limit) {
      *error = "frame of " + std::to_string(len) + " bytes exceeds the limit of " +
               std::to_string(frame_limit) + " bytes";
      return false;
    }
    if (!authenticated && len > kMaxHandshakeFrame) {
      *error = "frame of " + std::to_string(len) + " bytes before authenticating (the limit is " +
               std::to_string(kMaxHandshakeFrame) + ")";
      return false;
    }
    if (in_.size() - off - 5 < len) break;
    auto kind = static_cast<FrameKind>(static_cast<uint8_t>(in_[off + 4]));
    on_frame(kind, std::string_view(in_.data() + off + 5, len));
    off += 5 + len;
    if (!stream_) return false;
  }
  in_.erase(0, off);
  return true;
}

void FrameConn::Queue(FrameKind kind, std::string_view body) {
  uint32_t len = static_cast<uint32_t>(body.size());
  if (out_off_ > 0 && out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  }
  out_.append(reinterpret_cast<const char*>(&len), 4);
  out_.push_back(static_cast<char>(kind));
  out_.append(body);
}

bool FrameConn::Flush(std::string* error) {
  if (!stream_) return true;
  while (out_off_ < out_.size()) {
    ssize_t n = stream_->Write(out_.data() + out_off_, out_.size() - out_off_);
    if (n > 0) {
      out_off_ += n;
      if (bytes_out) bytes_out->Add(static_cast<uint64_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    *error = stream_->error().empty() ? std::string("send: ") + strerror(errno) : stream_->error();
    return false;
  }
  out_.clear();
  out_off_ = 0;
  return true;
}

int ConnectTcp(const std::string& host, int port, int timeout_ms, std::string* error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    *error = "cannot resolve " + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + strerror(errno);
    freeaddrinfo(res);
    return -1;
  }
  rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc < 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = poll(&p, 1, timeout_ms);
    if (rc == 1) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) {
        errno = err;
        rc = -1;
      } else {
        rc = 0;
      }
    } else {
      if (rc == 0) errno = ETIMEDOUT;
      rc = -1;
    }
  }
  if (rc < 0) {
    *error = "cannot connect to " + host + ":" + std::to_string(port) + ": " + strerror(errno);
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool WriteFrame(Stream& s, FrameKind kind, std::string_view body, std::string* error) {
  std::string out;
  uint32_t len = static_cast<uint32_t>(body.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out.push_back(static_cast<char>(kind));
  out.append(body);
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = s.Write(out.data() + off, out.size() - off);
    if (n > 0) {
      off += n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{s.fd(), static_cast<short>(s.wants_write() ? POLLOUT : POLLIN | POLLOUT), 0};
      poll(&p, 1, 1000);
    } else {
      *error = s.error().empty() ? std::string("send: ") + strerror(errno) : s.error();
      return false;
    }
  }
  return true;
}

static bool ReadExact(Stream& s, char* buf, size_t n, int64_t deadline_ms, std::string* error) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = s.Read(buf + off, n - off);
    if (r > 0) {
      off += r;
      continue;
    }
    if (r == 0) {
      *error = "connection closed by the daemon";
      return false;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *error = s.error().empty() ? std::string("read: ") + strerror(errno) : s.error();
      return false;
    }
    int64_t now = SteadyMs();
    if (deadline_ms >= 0 && now >= deadline_ms) {
      *error = "timed out waiting for the daemon";
      return false;
    }
    pollfd p{s.fd(), static_cast<short>(s.wants_write() ? POLLOUT : POLLIN), 0};
    poll(&p, 1, deadline_ms < 0 ? 1000 : static_cast<int>(deadline_ms - now));
  }
  return true;
}

bool ReadFrame(Stream& s, FrameKind* kind, std::string* body, int timeout_ms, std::string* error) {
  int64_t deadline = timeout_ms >= 0 ? SteadyMs() + timeout_ms : -1;
  char head[5];
  if (!ReadExact(s, head, 5, deadline, error)) return false;
  uint32_t len;
  memcpy(&len, head, 4);
  if (len > kMaxFrame) {
    *error = "oversized frame";
    return false;
  }
  *kind = static_cast<FrameKind>(static_cast<uint8_t>(head[4]));
  body->resize(len);
  return ReadExact(s, body->data(), len, deadline, error);
}

std::unique_ptr<Stream> ConnectAuthenticated(const std::string& host, int port,
                                             const std::shared_ptr<TlsContext>& tls, int replica,
                                             const std::string& secret, Principal who, int from_id,
                                             int timeout_ms, std::string* error) {
  int fd = ConnectTcp(host, port, timeout_ms, error);
  if (fd < 0) return nullptr;
  auto s = std::make_unique<Stream>(fd, tls, /*accepting=*/false);
  std::string where = host + ":" + std::to_string(port);
  if (!s->Handshake(timeout_ms)) {
    *error = "TLS with " + where + " failed: " + s->error();
    return nullptr;
  }
  // The CA vouches for every replica: the one answering must be the one meant.
  if (s->peer_replica() != replica) {
    *error = where + " presented the certificate of " +
             (s->peer_replica() < 0 ? std::string("no replica")
                                    : "replica " + std::to_string(s->peer_replica())) +
             ", not replica " + std::to_string(replica) + "'s";
    return nullptr;
  }
  FrameKind kind;
  std::string body;
  if (!WriteFrame(*s, FrameKind::kHello, EncodeHello(who, from_id), error) ||
      !ReadFrame(*s, &kind, &body, timeout_ms, error))
    return nullptr;
  if (kind == FrameKind::kRefused || kind != FrameKind::kChallenge) {
    *error = kind == FrameKind::kRefused ? "refused by " + where + ": " + body
                                         : "unexpected handshake reply";
    return nullptr;
  }
  if (!WriteFrame(*s, FrameKind::kAuth, AuthProof(secret, body, who, from_id), error) ||
      !ReadFrame(*s, &kind, &body, timeout_ms, error))
    return nullptr;
  if (kind != FrameKind::kWelcome) {
    *error = kind == FrameKind::kRefused ? "refused by " + where + ": " + body
                                         : "unexpected handshake reply";
    return nullptr;
  }
  return s;
}

}  // namespace lockstep
