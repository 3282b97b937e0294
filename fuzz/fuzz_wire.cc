// fuzz_wire.cc — libFuzzer target for guard/net/wire.h: every decoder of bytes a
// peer or a client sends (the protocol messages, the HELLO, the client
// requests and replies, a state transfer's parts, the output-checking
// messages) and the frame reader (FrameConn::ReadFrames, fed through a
// socketpair). The first byte picks the decoder; a decode that succeeds is
// encoded again and must decode to the same value.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "fuzz/fuzz_util.h"
#include "guard/daemon/failpoints.h"
#include "guard/net/wire.h"

namespace lockstep {
namespace {

bool SameEntries(const std::vector<Entry>& a, const std::vector<Entry>& b) {
  return a == b;
}

void Message_(std::string_view in) {
  Message m;
  if (!DecodeMessage(in, &m)) return;
  Message m2;
  FUZZ_CHECK(DecodeMessage(EncodeMessage(m), &m2));
  FUZZ_CHECK(m2.type == m.type && m2.from == m.from && m2.to == m.to && m2.ballot == m.ballot &&
             m2.stream_id == m.stream_id && m2.commit_index == m.commit_index &&
             m2.sent_pos == m.sent_pos && m2.promised == m.promised && m2.granted == m.granted &&
             SameEntries(m2.entries, m.entries) && m2.transport == m.transport);
  FUZZ_CHECK(m.from >= 0 && m.from < kMaxMemberIds && m.to >= 0 && m.to < kMaxMemberIds);
  for (const Entry& e : m.entries) FUZZ_CHECK(IsSlotType(e.type));
}

void Hello_(std::string_view in) {
  Hello h;
  if (!DecodeHello(in, &h)) return;
  Principal who;
  if (h.magic != kWireMagic || h.version != kWireVersion || !ParsePrincipal(h.role, &who)) return;
  Hello h2;
  FUZZ_CHECK(DecodeHello(EncodeHello(who, static_cast<int>(h.from)), &h2));
  FUZZ_CHECK(h2.magic == h.magic && h2.version == h.version && h2.role == h.role &&
             h2.from == h.from);
}

void ProposeRequest_(std::string_view in) {
  ProposeRequest r, r2;
  if (!DecodeProposeRequest(in, &r)) return;
  FUZZ_CHECK(DecodeProposeRequest(EncodeProposeRequest(r.type, r.payload), &r2));
  FUZZ_CHECK(r2.type == r.type && r2.payload == r.payload);
}

void ReadRequest_(std::string_view in) {
  ReadRequest r, r2;
  if (!DecodeReadRequest(in, &r)) return;
  FUZZ_CHECK(DecodeReadRequest(EncodeReadRequest(r), &r2));
  FUZZ_CHECK(r2.from == r.from && r2.max == r.max);
}

void TruncateRequest_(std::string_view in) {
  TruncateRequest r, r2;
  if (!DecodeTruncateRequest(in, &r)) return;
  FUZZ_CHECK(DecodeTruncateRequest(EncodeTruncateRequest(r), &r2));
  FUZZ_CHECK(r2.below == r.below);
}

void CheckpointRequest_(std::string_view in) {
  CheckpointRequest r, r2;
  if (!DecodeCheckpointRequest(in, &r)) return;
  FUZZ_CHECK(r.op == CheckpointOp::kNow || r.op == CheckpointOp::kList);
  std::string again = EncodeCheckpointRequest(r);
  FUZZ_CHECK(again == in);  // one byte, fully checked
  FUZZ_CHECK(DecodeCheckpointRequest(again, &r2) && r2.op == r.op);
}

void FetchCheckpointRequest_(std::string_view in) {
  FetchCheckpointRequest r, r2;
  if (!DecodeFetchCheckpointRequest(in, &r)) return;
  std::string again = EncodeFetchCheckpointRequest(r);
  FUZZ_CHECK(again == in);
  FUZZ_CHECK(DecodeFetchCheckpointRequest(again, &r2) && r2.min_index == r.min_index);
}

void ProposeReply_(std::string_view in) {
  ProposeReply r, r2;
  if (!DecodeProposeReply(in, &r)) return;
  FUZZ_CHECK(DecodeProposeReply(EncodeProposeReply(r), &r2));
  FUZZ_CHECK(r2.ok == r.ok && r2.index == r.index && r2.error == r.error &&
             fuzz::SameBits(r2.commit_us, r.commit_us) &&
             fuzz::SameBits(r2.durable_us, r.durable_us) &&
             fuzz::SameBits(r2.quorum_us, r.quorum_us));
}

void ReadReply_(std::string_view in) {
  ReadReply r, r2;
  if (!DecodeReadReply(in, &r)) return;
  std::vector<const Entry*> ptrs;
  for (const Entry& e : r.entries) ptrs.push_back(&e);
  FUZZ_CHECK(DecodeReadReply(EncodeReadReply(r.commit_index, ptrs), &r2));
  FUZZ_CHECK(r2.commit_index == r.commit_index && SameEntries(r2.entries, r.entries));
}

void TruncateReply_(std::string_view in) {
  TruncateReply r, r2;
  if (!DecodeTruncateReply(in, &r)) return;
  FUZZ_CHECK(DecodeTruncateReply(EncodeTruncateReply(r), &r2));
  FUZZ_CHECK(r2.ok == r.ok && r2.first_index == r.first_index);
}

void CheckpointReply_(std::string_view in) {
  CheckpointReply r, r2;
  if (!DecodeCheckpointReply(in, &r)) return;
  FUZZ_CHECK(DecodeCheckpointReply(EncodeCheckpointReply(r), &r2));
  FUZZ_CHECK(r2.ok == r.ok && r2.text == r.text);
}

void CheckpointPart_(std::string_view in) {
  CheckpointPart p, p2;
  if (!DecodeCheckpointPart(in, &p)) return;
  FUZZ_CHECK(DecodeCheckpointPart(EncodeCheckpointPart(p), &p2));
  FUZZ_CHECK(p2.path == p.path && p2.symlink == p.symlink && p2.offset == p.offset &&
             p2.bytes == p.bytes && p2.mode == p.mode);
}

void CheckpointDone_(std::string_view in) {
  CheckpointDone d, d2;
  if (!DecodeCheckpointDone(in, &d)) return;
  FUZZ_CHECK(DecodeCheckpointDone(EncodeCheckpointDone(d), &d2));
  FUZZ_CHECK(d2.ok == d.ok && d2.index == d.index && d2.error == d.error);
}

void OutputReport_(std::string_view in) {
  OutputReport r, r2;
  if (!DecodeOutputReport(in, &r)) return;
  FUZZ_CHECK(DecodeOutputReport(EncodeOutputReport(r), &r2));
  FUZZ_CHECK(r2.ballot == r.ballot && r2.daemon_pid == r.daemon_pid &&
             r2.points.size() == r.points.size());
  for (size_t i = 0; i < r.points.size(); i++) {
    const OutputPoint &a = r.points[i], &b = r2.points[i];
    FUZZ_CHECK(a.key == b.key && a.offset == b.offset && a.digest == b.digest &&
               a.applied == b.applied && a.mark == b.mark && a.ended == b.ended);
  }
}

void RepairOrder_(std::string_view in) {
  RepairOrder o, o2;
  if (!DecodeRepairOrder(in, &o)) return;
  FUZZ_CHECK(o.how == RepairHow::kRollback || o.how == RepairHow::kTransfer ||
             o.how == RepairHow::kDescribe);
  FUZZ_CHECK(o.agreeing.size() <= static_cast<size_t>(kMaxMemberIds));
  for (int r : o.agreeing) FUZZ_CHECK(r >= 0 && r < kMaxMemberIds);
  std::string again = EncodeRepairOrder(o);
  FUZZ_CHECK(again == in);  // every byte checked: nothing else encodes this order
  FUZZ_CHECK(DecodeRepairOrder(again, &o2));
  FUZZ_CHECK(o2.ballot == o.ballot && o2.id == o.id && o2.how == o.how &&
             o2.max_index == o.max_index && o2.key == o.key && o2.offset == o.offset &&
             o2.agreeing == o.agreeing);
}

void RepairResult_(std::string_view in) {
  RepairResult r, r2;
  if (!DecodeRepairResult(in, &r)) return;
  FUZZ_CHECK(r.sends.size() <= 64);
  FUZZ_CHECK(DecodeRepairResult(EncodeRepairResult(r), &r2));
  FUZZ_CHECK(r2.id == r.id && r2.ok == r.ok && r2.action == r.action && r2.error == r.error &&
             r2.restored_index == r.restored_index && r2.restore_us == r.restore_us &&
             r2.total_us == r.total_us && r2.window_start == r.window_start &&
             r2.have_window == r.have_window && r2.window == r.window &&
             r2.sends.size() == r.sends.size());
  for (size_t i = 0; i < r.sends.size(); i++)
    FUZZ_CHECK(r2.sends[i].start == r.sends[i].start && r2.sends[i].end == r.sends[i].end &&
               r2.sends[i].frames == r.sends[i].frames);
}

void DivergenceRequest_(std::string_view in) {
  DivergenceRequest r, r2;
  if (!DecodeDivergenceRequest(in, &r)) return;
  FUZZ_CHECK(r.op == DivergenceOp::kList || r.op == DivergenceOp::kShow);
  std::string again = EncodeDivergenceRequest(r);
  FUZZ_CHECK(again == in);
  FUZZ_CHECK(DecodeDivergenceRequest(again, &r2) && r2.op == r.op && r2.id == r.id);
}

void FailpointRequest_(std::string_view in) {
  FailpointRequest r, r2;
  if (!DecodeFailpointRequest(in, &r)) return;
  std::string again = EncodeFailpointRequest(r);
  FUZZ_CHECK(again == in);
  FUZZ_CHECK(DecodeFailpointRequest(again, &r2) && r2.spec == r.spec);
  FailpointSpec spec;  // the daemon parses what it decoded
  std::string err;
  if (ParseFailpointSpec(r.spec, &spec, &err)) {
    FailpointSpec back;
    FUZZ_CHECK(ParseFailpointSpec(FormatFailpointSpec(spec), &back, &err));
    FUZZ_CHECK(FormatFailpointSpec(back) == FormatFailpointSpec(spec));
  }
}

void FailpointReply_(std::string_view in) {
  FailpointReply r, r2;
  if (!DecodeFailpointReply(in, &r)) return;
  FUZZ_CHECK(DecodeFailpointReply(EncodeFailpointReply(r), &r2));
  FUZZ_CHECK(r2.ok == r.ok && r2.text == r.text);
}

void InspectRequest_(std::string_view in) {
  InspectRequest r, r2;
  if (!DecodeInspectRequest(in, &r)) return;
  std::string again = EncodeInspectRequest(r);
  FUZZ_CHECK(again == in);
  FUZZ_CHECK(DecodeInspectRequest(again, &r2) && r2.program == r.program);
}

void InspectReply_(std::string_view in) {
  InspectReply r, r2;
  if (!DecodeInspectReply(in, &r)) return;
  FUZZ_CHECK(DecodeInspectReply(EncodeInspectReply(r), &r2));
  FUZZ_CHECK(r2.ok == r.ok && r2.text == r.text);
}

using Decoder = void (*)(std::string_view);
constexpr Decoder kDecoders[] = {Message_,
                                 Hello_,
                                 ProposeRequest_,
                                 ReadRequest_,
                                 TruncateRequest_,
                                 CheckpointRequest_,
                                 FetchCheckpointRequest_,
                                 ProposeReply_,
                                 ReadReply_,
                                 TruncateReply_,
                                 CheckpointReply_,
                                 CheckpointPart_,
                                 CheckpointDone_,
                                 OutputReport_,
                                 RepairOrder_,
                                 RepairResult_,
                                 DivergenceRequest_,
                                 FailpointRequest_,
                                 FailpointReply_,
                                 InspectRequest_,
                                 InspectReply_};
constexpr size_t kNumDecoders = sizeof kDecoders / sizeof kDecoders[0];

// The decoder the daemon or the client runs on a frame of this kind.
void DecodeFrame(FrameKind kind, std::string_view body) {
  switch (kind) {
    case FrameKind::kHello: return Hello_(body);
    case FrameKind::kPeerMessage: return Message_(body);
    case FrameKind::kPropose: return ProposeRequest_(body);
    case FrameKind::kProposeResult: return ProposeReply_(body);
    case FrameKind::kRead: return ReadRequest_(body);
    case FrameKind::kReadResult: return ReadReply_(body);
    case FrameKind::kTruncate: return TruncateRequest_(body);
    case FrameKind::kTruncateResult: return TruncateReply_(body);
    case FrameKind::kCheckpoint: return CheckpointRequest_(body);
    case FrameKind::kCheckpointResult: return CheckpointReply_(body);
    case FrameKind::kFetchCheckpoint: return FetchCheckpointRequest_(body);
    case FrameKind::kCheckpointPart: return CheckpointPart_(body);
    case FrameKind::kCheckpointDone: return CheckpointDone_(body);
    case FrameKind::kOutputReport: return OutputReport_(body);
    case FrameKind::kRepairOrder: return RepairOrder_(body);
    case FrameKind::kFailpoint: return FailpointRequest_(body);
    case FrameKind::kFailpointResult: return FailpointReply_(body);
    case FrameKind::kInspect: return InspectRequest_(body);
    case FrameKind::kInspectResult: return InspectReply_(body);
    case FrameKind::kRepairResult: return RepairResult_(body);
    case FrameKind::kDivergence: return DivergenceRequest_(body);
    default: return;
  }
}

// The byte stream of one connection, as FrameConn::ReadFrames takes it from
// its socket: frames of at most the limit, each handed on whole.
void Frames(bool authenticated, std::string_view stream) {
  int fds[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  FrameConn conn(std::make_unique<Stream>(fds[0]), ConnRole::kPeer);  // closes fds[0]
  conn.authenticated = authenticated;
  size_t sent = 0;
  uint64_t framed = 0;  // body bytes handed on
  auto on_frame = [&](FrameKind kind, std::string_view body) {
    FUZZ_CHECK(body.size() <= kMaxFrame);
    FUZZ_CHECK(authenticated || body.size() <= kMaxHandshakeFrame);
    framed += 5 + body.size();
    DecodeFrame(kind, body);
  };
  std::string error;
  bool open = true;
  while (open) {
    bool all_sent = sent == stream.size();
    if (!all_sent) {
      ssize_t n = send(fds[1], stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL);
      FUZZ_CHECK(n > 0 || errno == EAGAIN);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    open = conn.ReadFrames(on_frame, &error);
    FUZZ_CHECK(open || !error.empty());
    if (all_sent) break;
  }
  close(fds[1]);
  FUZZ_CHECK(framed <= sent);
}

}  // namespace
}  // namespace lockstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte 255: a stream of frames; otherwise which decoder (new ones
  // are appended to kDecoders, so a seed keeps its decoder).
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] != 255) {
    lockstep::kDecoders[data[0] % lockstep::kNumDecoders](in);
  } else if (!in.empty()) {
    lockstep::Frames((in[0] & 1) != 0, in.substr(1));
  }
  return 0;
}
