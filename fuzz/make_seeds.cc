// make_seeds.cc — writes the seed corpus of every fuzz target (fuzz/corpus/)
// from the real encoders, so that each fuzzer starts with inputs that pass
// the decoders' first checks. Run by `scripts/fuzz --seeds`; its output is
// committed. Usage: fuzz_make_seeds CORPUS_DIR SOURCE_DIR
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/store.h"
#include "consensus/log_format.h"
#include "consensus/membership.h"
#include "consensus/region.h"
#include "guard/common/config.h"
#include "guard/common/json.h"
#include "guard/net/wire.h"
#include "guard/output/divergence_report.h"
#include "guard/server/log_input.h"
#include "guard/server/restore_point.h"
#include "preload/shim_abi.h"

namespace lockstep {
namespace {

std::string g_dir;

void Put(const std::string& target, const std::string& name, const std::string& bytes) {
  std::string dir = g_dir + "/" + target;
  mkdir(g_dir.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
    exit(1);
  }
}

std::string Byte(int b) {
  return std::string(1, static_cast<char>(b));
}

std::string U64(uint64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}

std::string Frame(FrameKind kind, const std::string& body) {
  uint32_t len = static_cast<uint32_t>(body.size());
  return std::string(reinterpret_cast<const char*>(&len), 4) + Byte(static_cast<int>(kind)) + body;
}

std::string Record(EntryType type, Ballot ballot, uint64_t index, uint64_t position,
                   const std::string& payload) {
  std::string out(RecordSize(payload.size()), '\0');
  EncodeRecord(reinterpret_cast<uint8_t*>(out.data()), type, ballot, index, index, position,
               payload);
  return out;
}

void Wire() {
  // The selector is the decoder's place in fuzz_wire.cc's kDecoders.
  Entry e1{7, MakeBallot(3, 1), EntryType::kInput,
           EncodeInput(2, {MakeBallot(3, 1), 4}, 9, "SET k v", 1)};
  Entry e2{8, MakeBallot(3, 1), EntryType::kNoop, ""};
  Message m;
  m.type = Message::Type::kPromise;
  m.from = 1;
  m.to = 2;
  m.ballot = MakeBallot(4, 2);
  m.stream_id = 11;
  m.commit_index = 6;
  m.entries = {e1, e2};
  m.transport = "ucx-blob";
  std::string promise = EncodeMessage(m);
  Put("wire", "message_promise", Byte(0) + promise);
  m.type = Message::Type::kHeartbeat;
  m.entries.clear();
  m.sent_pos = 4096;
  std::string heartbeat = EncodeMessage(m);
  Put("wire", "message_heartbeat", Byte(0) + heartbeat);
  std::string hello = EncodeHello(Principal::kPeer, 2);
  Put("wire", "hello_peer", Byte(1) + hello);
  Put("wire", "hello_admin", Byte(1) + EncodeHello(Principal::kAdmin, 0));
  std::string propose = EncodeProposeRequest(EntryType::kInput, "hello world");
  Put("wire", "propose_request", Byte(2) + propose);
  std::string read = EncodeReadRequest({5, 100});
  Put("wire", "read_request", Byte(3) + read);
  Put("wire", "truncate_request", Byte(4) + EncodeTruncateRequest({40}));
  Put("wire", "checkpoint_request", Byte(5) + EncodeCheckpointRequest({CheckpointOp::kNow}));
  std::string fetch = EncodeFetchCheckpointRequest({77});
  Put("wire", "fetch_checkpoint_request", Byte(6) + fetch);
  ProposeReply pr;
  pr.ok = true;
  pr.index = 12;
  pr.commit_us = 35.5;
  pr.durable_us = 20;
  pr.quorum_us = 15.5;
  Put("wire", "propose_reply_ok", Byte(7) + EncodeProposeReply(pr));
  pr = ProposeReply{};
  pr.error = "not the leader";
  Put("wire", "propose_reply_error", Byte(7) + EncodeProposeReply(pr));
  std::string read_reply = EncodeReadReply(8, {&e1, &e2});
  Put("wire", "read_reply", Byte(8) + read_reply);
  Put("wire", "truncate_reply", Byte(9) + EncodeTruncateReply({true, 41}));
  Put("wire", "checkpoint_reply", Byte(10) + EncodeCheckpointReply({true, "[{\"index\":40}]"}));
  CheckpointPart part{"img/pages-1.img", false, 4096, std::string(64, 'p')};
  std::string part_bytes = EncodeCheckpointPart(part);
  Put("wire", "checkpoint_part", Byte(11) + part_bytes);
  Put("wire", "checkpoint_part_link",
      Byte(11) + EncodeCheckpointPart({"data/current", true, 0, "data-1"}));
  std::string done = EncodeCheckpointDone({true, 40, ""});
  Put("wire", "checkpoint_done", Byte(12) + done);
  OutputReport rep;
  rep.ballot = MakeBallot(4, 0);
  rep.daemon_pid = 1234;
  rep.points = {{{MakeBallot(3, 0), 1}, 100, 0xabcdef, 7, false},
                {{MakeBallot(3, 0), 2}, 65536, 0x12345, 9, true}};
  std::string report = EncodeOutputReport(rep);
  Put("wire", "output_report", Byte(13) + report);
  RepairOrder order;
  order.ballot = MakeBallot(4, 0);
  order.id = "2-1";
  order.how = RepairHow::kTransfer;
  order.max_index = 30;
  order.key = {MakeBallot(3, 0), 1};
  order.offset = 100;
  order.agreeing = {0, 2};
  std::string order_bytes = EncodeRepairOrder(order);
  Put("wire", "repair_order", Byte(14) + order_bytes);
  RepairResult res;
  res.id = "2-1";
  res.ok = true;
  res.action = "rolled back to checkpoint 20";
  res.restored_index = 20;
  res.have_window = true;
  res.window = "+OK\r\n";
  res.sends = {{0, 5, "0x401000 main"}};
  std::string result = EncodeRepairResult(res);
  Put("wire", "repair_result", Byte(15) + result);
  Put("wire", "failpoint_request",
      Byte(17) + EncodeFailpointRequest({"drop=0.25 delay_ms=10 jitter_ms=5 to=1 seed=3"}));
  Put("wire", "failpoint_reply", Byte(18) + EncodeFailpointReply({true, "off"}));
  std::string div = EncodeDivergenceRequest({DivergenceOp::kShow, "2-1"});
  Put("wire", "divergence_request", Byte(16) + div);
  // The frame reader (selector 17), then 0: before authenticating, 1: after.
  Put("wire", "frames_handshake",
      Byte(255) + Byte(0) + Frame(FrameKind::kHello, hello) +
          Frame(FrameKind::kAuth, std::string(32, 'a')));
  Put("wire", "frames_peer",
      Byte(255) + Byte(1) + Frame(FrameKind::kPeerMessage, promise) +
          Frame(FrameKind::kPeerMessage, heartbeat) + Frame(FrameKind::kOutputReport, report) +
          Frame(FrameKind::kRepairOrder, order_bytes) + Frame(FrameKind::kRepairResult, result));
  Put("wire", "frames_client",
      Byte(255) + Byte(1) + Frame(FrameKind::kPropose, propose) + Frame(FrameKind::kRead, read) +
          Frame(FrameKind::kStatus, "") + Frame(FrameKind::kReadResult, read_reply) +
          Frame(FrameKind::kFetchCheckpoint, fetch) +
          Frame(FrameKind::kCheckpointPart, part_bytes) + Frame(FrameKind::kCheckpointDone, done) +
          Frame(FrameKind::kDivergence, div));
}

void LogRecord() {
  // mode u8, position u64, bytes (fuzz_log_record.cc).
  uint64_t pos = 8192;
  std::string rec = Record(EntryType::kInput, MakeBallot(2, 1), 5, pos, "a client's bytes");
  Put("log_record", "record", Byte(0) + U64(pos) + rec);
  Put("log_record", "record_sealed", Byte(1) + U64(pos) + rec);
  std::string seg = Record(EntryType::kPromise, MakeBallot(2, 1), 0, pos, "");
  seg += Record(EntryType::kInput, MakeBallot(2, 1), 5, pos + seg.size(), std::string(100, 'x'));
  seg += Record(EntryType::kTruncate, 0, 3, pos + seg.size(), "");
  seg += Record(EntryType::kPad, 0, 0, pos + seg.size(), std::string(40, '\0'));
  Put("log_record", "segment", Byte(2) + U64(pos) + seg);
  Put("log_record", "segment_sealed", Byte(3) + U64(pos) + seg);
  // A ring of 512 bytes: two records, a wrap, and the next lap's first record.
  const uint64_t ring = 512;
  std::string r1 = Record(EntryType::kInput, MakeBallot(2, 1), 1, 0, std::string(150, 'a'));
  std::string r2 = Record(EntryType::kInput, MakeBallot(2, 1), 2, r1.size(), std::string(200, 'b'));
  uint64_t at = r1.size() + r2.size();
  std::string wrap = Record(EntryType::kWrap, MakeBallot(2, 1), 0, at, "");
  std::string r3 = Record(EntryType::kNoop, MakeBallot(2, 1), 3, ring, "");
  std::string ringbuf(ring, '\0');
  ringbuf.replace(0, r1.size(), r1);
  ringbuf.replace(r1.size(), r2.size(), r2);
  ringbuf.replace(at, wrap.size(), wrap);
  std::string lap2 = ringbuf;
  lap2.replace(0, r3.size(), r3);
  Put("log_record", "ring", Byte(4) + U64(0) + ringbuf);
  Put("log_record", "ring_lap2", Byte(4) + U64(0) + lap2);
  Put("log_record", "ring_sealed", Byte(4) + U64(1) + ringbuf);
  ControlWord cw{MakeBallot(2, 1), 3, 5, 9, 1024, 0};
  SealControl(&cw);
  std::string word(reinterpret_cast<const char*>(&cw), sizeof cw);
  Put("log_record", "control_word", Byte(5) + U64(0) + word);
  AckWord aw{MakeBallot(2, 1), 3, 5, 1024, 9, 0};
  SealAck(&aw);
  Put("log_record", "ack_word",
      Byte(5) + U64(0) + std::string(reinterpret_cast<const char*>(&aw), sizeof aw));
  // A kConfig payload: a learner added to three voters.
  ConfigEntry add{Membership::Initial(3), {}};
  ApplyMembershipChange(add.from, {MembershipChangeKind::kAddLearner, 3}, &add.to);
  Put("log_record", "config", Byte(6) + U64(0) + EncodeConfigEntry(add));
  Put("log_record", "config_sealed", Byte(7) + U64(0) + EncodeConfigEntry(add));
  // The configuration it makes, on its own (a truncation's note).
  Put("log_record", "membership", Byte(8) + U64(0) + EncodeMembership(add.to));
  Put("log_record", "membership_sealed", Byte(9) + U64(0) + EncodeMembership(add.to));
}

void LogInput() {
  ConnKey k{MakeBallot(3, 1), 4};
  Put("log_input", "accept",
      EncodeInput(LS_SUB_ACCEPT, k, 1, "127.0.0.1:5555", 1700000000000000000));
  Put("log_input", "data",
      EncodeInput(LS_SUB_DATA, k, 2, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
                  1700000000000001000, 54));
  Put("log_input", "close", EncodeInput(LS_SUB_CLOSE, k, 0, "", 1700000000000002000));
  Put("log_input", "tick", EncodeInput(LS_SUB_TICK, {k.ballot, 7}, 4, "", 1700000000000003000));
  std::string old = EncodeInput(LS_SUB_DATA, k, 3, "PING\r\n", 0);
  Put("log_input", "data_before_stamps", old.substr(0, old.size() - 16));
  Put("log_input", "data_before_gate", old.substr(0, old.size() - 8));
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Config(const std::string& src) {
  ClusterConfig c;
  c.secret = "0123456789abcdef0123456789abcdef";
  c.server.command = "redis-server --port {port} --dir {dir} --save ''";
  c.server.app = "redis";
  c.server.ready_log = "Ready to accept";
  c.server.same_random = true;
  c.server.same_clock = true;
  c.server.serial_inputs = true;
  c.server.serial_until_reply = true;
  c.server.data_template = "template";
  c.server.rendered_files = {"slapd.conf", "sub/b.ndb"};
  c.server.unchecked_replies = "INFO, CLIENT LIST";
  for (int i = 0; i < 3; i++) {
    ReplicaConfig r;
    r.id = i;
    r.host = "127.0.0.1";
    r.peer_port = 7000 + i;
    r.client_port = 7100 + i;
    r.server_port = 7200 + i;
    r.dir = "/tmp/lockstep/r" + std::to_string(i);
    c.replicas.push_back(r);
  }
  std::string error;
  ClusterConfig parsed;
  std::string text = FormatClusterConfig(c);
  if (!ParseClusterConfig(text, "seed.toml", &parsed, &error)) {
    fprintf(stderr, "seed cluster.toml does not parse: %s\n", error.c_str());
    exit(1);
  }
  Put("config", "cluster_server", Byte(0) + text);
  ClusterConfig client;  // a client's copy: no server, only client_secret
  client.client_secret = "fedcba9876543210fedcba9876543210";
  client.replicas = c.replicas;
  for (auto& r : client.replicas) r.server_port = 0;
  Put("config", "cluster_client", Byte(0) + FormatClusterConfig(client));
  for (const char* app : {"redis", "slapd"}) {
    std::string profile = ReadText(src + "/apps/" + app + ".toml");
    if (profile.size() > 4096) profile.resize(4096);
    Put("config", std::string("profile_") + app, Byte(1) + profile);
  }
  // A profile in the TOML toml++ reads beyond the old subset: multi-line
  // strings of both kinds, digit separators, lists as arrays over several
  // lines, and an inline table the getters refuse.
  Put("config", "profile_toml",
      Byte(1) +
          "command = \"srv --port {port}\"  # a comment\n"
          "description = \"\"\"\ntwo\nlines\"\"\"\n"
          "bench = '''\nC:\\raw\n'''\n"
          "ready_timeout_ms = 20_000\n"
          "files = [\n  \"a.conf\",\n  'sub/b.ndb',\n]\n"
          "unchecked_replies = [\"INFO\", \"CLIENT LIST\"]\n"
          "state_probe = { argv = ['probe'] }\n");
}

void ManifestSeeds() {
  Manifest m;
  m.index = 40;
  m.meta.replica_id = 1;
  m.meta.time_unix = 1700000000;
  m.meta.dump_us = 210000;
  RestorePoint rp;
  rp.server_fds = {5, 6, 7};
  rp.open_conns = {{MakeBallot(3, 0), 1}, {MakeBallot(3, 0), 2}};
  rp.replay_conns = {{{MakeBallot(3, 0), 1}, 0, 4096}};
  rp.log_bytes = 123456;
  m.meta.extra = EncodeRestorePoint(rp);
  m.bytes = 300;
  m.entries = {{false, "data/dump 1.rdb", 100, std::string(64, 'a'), ""},
               {false, "img/pages-1.img", 200, std::string(64, 'b'), ""},
               {true, "data/current", 0, "", "dump%1.rdb"}};
  std::string text = EncodeManifest(m);
  Put("manifest", "manifest", Byte(0) + text);
  // Odd first byte: the target writes the end line itself.
  size_t end = text.rfind("end ");
  Put("manifest", "manifest_body", Byte(1) + text.substr(0, end));
  Put("restore_point", "restore_point", m.meta.extra);
  Put("restore_point", "restore_point_empty", EncodeRestorePoint(RestorePoint{}));
  rp.membership = EncodeMembership(Membership::Initial(3));
  Put("restore_point", "restore_point_membership", EncodeRestorePoint(rp));
}

std::string SubRecord(uint8_t kind, uint32_t conn, uint64_t seq, const std::string& payload) {
  ls_sub_record h{};
  h.len = static_cast<uint32_t>(payload.size());
  h.kind = kind;
  h.conn = conn;
  h.seq = seq;
  h.out_before = 10;
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out += payload;
  out.resize((out.size() + 7) & ~size_t{7}, '\0');
  return out;
}

void ShimRing() {
  // mode u8, tail u64, head u64, ring bytes (fuzz_shim_ring.cc).
  ls_tick tick{7, 0, 1700000000000000000};
  std::string ring =
      SubRecord(LS_SUB_ACCEPT, 1, 1, "127.0.0.1:40000") + SubRecord(LS_SUB_DATA, 1, 2, "PING\r\n") +
      SubRecord(LS_SUB_CLOSE, 1, 3, "") +
      SubRecord(LS_SUB_TICK, 0, 4, std::string(reinterpret_cast<const char*>(&tick), sizeof tick));
  Put("shim_ring", "submissions", Byte(0) + U64(0) + U64(ring.size()) + ring);
  // A lap later: the tail near the end, a wrap there, records from the start.
  std::string lap = SubRecord(LS_SUB_DATA, 2, 9, "GET k\r\n");
  size_t wrap_at = 256;
  std::string ring2(wrap_at + 8, '\0');
  ring2.replace(0, lap.size(), lap);
  ring2[wrap_at + 4] = static_cast<char>(LS_SUB_WRAP);
  uint64_t tail = 2 * ring2.size() + wrap_at;
  Put("shim_ring", "submissions_wrap", Byte(0) + U64(tail) + U64(tail + 8 + lap.size()) + ring2);
  Put("shim_ring", "submissions_near", Byte(4) + U64(0) + U64(ring.size()) + ring);
  std::string outs;
  for (ls_out_record r : {ls_out_record{100, 0xabc, 1, LS_OUT_NONE, 3, 0, 0},
                          ls_out_record{65536, 0xdef, 2, 5, 4, LS_OUT_MARK, 0},
                          ls_out_record{70000, 0x123, 2, 5, 4, LS_OUT_CLOSED, 0}})
    outs += std::string(reinterpret_cast<const char*>(&r), sizeof r);
  Put("shim_ring", "output_records", Byte(1) + outs);
}

std::string Multibulk(const std::vector<std::string>& args) {
  std::string s = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) s += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
  return s;
}

void RespScan() {
  // list NUL, read cut u8, send cut u8, request bytes u16, requests, replies
  // (fuzz_resp_scan.cc): a redis session with INFO and CLIENT LIST unchecked.
  std::string info = "$31\r\n# Server\r\nprocess_id:4242\r\nup\r\n";
  std::string req = Multibulk({"SET", "k", "v"}) + Multibulk({"info"}) + Multibulk({"GET", "k"}) +
                    "info  memory\r\n" + Multibulk({"CLIENT", "LIST"}) + "PING\r\n" +
                    Multibulk({"MULTI"}) + Multibulk({"INFO"}) + Multibulk({"EXEC"}) +
                    Multibulk({"HELLO", "3"}) + Multibulk({"SUBSCRIBE", "ch"});
  std::string rep = "+OK\r\n" + info + "$1\r\nv\r\n" + info + "$12\r\nid=3 addr=x\r\n" +
                    "+PONG\r\n+OK\r\n+QUEUED\r\n*1\r\n" + info +
                    "%2\r\n+server\r\n$5\r\nredis\r\n+proto\r\n:3\r\n" +
                    ">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n";
  uint16_t n = static_cast<uint16_t>(req.size());
  std::string len(reinterpret_cast<const char*>(&n), 2);
  Put("resp_scan", "session",
      std::string("INFO, CLIENT LIST") + Byte(0) + Byte(0) + Byte(0) + len + req + rep);
  Put("resp_scan", "session_cut",
      std::string("INFO, CLIENT LIST, MEMORY") + Byte(0) + Byte(3) + Byte(5) + len + req + rep);
}

// fuzz_json: the first byte picks the reader (0 status, 1 checkpoint list,
// 2 report file, 3 list answer, 4 bytes).
void JsonSeeds() {
  // A daemon's status, in FrontDoor::StatusJson's shape.
  Json status = {{"id", 1},
                 {"pid", 4242},
                 {"role", "backup"},
                 {"ballot", "3.0"},
                 {"leader", 0},
                 {"commit_index", 120},
                 {"durable_index", 120},
                 {"last_index", 121},
                 {"first_index", 1},
                 {"transport", "shm"},
                 {"durability", "disk"},
                 {"may_vote", true},
                 {"disk_error", ""},
                 {"applied_index", 119},
                 {"server_read_all", true},
                 {"server_pid", 4300},
                 {"server_port", 7101},
                 {"replay_connections", 2},
                 {"checkpoint",
                  {{"index", 100},
                   {"age_s", 3},
                   {"kept", 2},
                   {"taken", 2},
                   {"failed", 0},
                   {"server_state", "running"},
                   {"crashes", 0},
                   {"restored_from", 0}}},
                 {"output",
                  {{"role", "reporter"},
                   {"checks", 40},
                   {"ends_settled", {0, 3, 3}},
                   {"reports", 1},
                   {"suspended", Json::array()}}},
                 {"state_checks", nullptr},
                 {"peers", {{{"id", 0}, {"match", 121}, {"stream", true}}}}};
  Put("json", "status", Byte(0) + JsonText(status));
  Json list = {{{"replica", 1},
                {"index", 100},
                {"time_unix", 1764633600},
                {"bytes", 3000000},
                {"dump_us", 210000},
                {"ok", true},
                {"path", "/tmp/c/replica-1/checkpoints/100"},
                {"error", ""}}};
  Put("json", "checkpoint_list", Byte(1) + JsonText(list));
  // A report from the real encoder, with bytes that are not text.
  DivergenceReport r;
  r.id = "0-1";
  r.time_unix = 1764633600;
  r.leader = 0;
  r.replica = 2;
  r.agreeing = {1};
  r.key = ConnKey{MakeBallot(3, 0), 7};
  r.offset = 64;
  r.window_from = 10;
  r.window_to = 14;
  r.inputs = {"DATA 23 bytes: *2\\r\\n$3\\r\\nGET\\r\\n$2\\r\\nfk\\r\\n"};
  r.inputs_in_window = 3;
  r.outputs = {{0, true, 0, "$8\r\nflipme-A\r\n", "leader", {}},
               {2, true, 0, std::string("$8\r\nflipme-\xe9\x00\r\n", 15), "backup", {}}};
  r.first_difference = 11;
  r.status = "repaired";
  r.how = "rollback";
  r.total_ms = 812.5;
  r.stack = "#0 write\n#1 _writeToClient+0x1f";
  Put("json", "report", Byte(2) + r.ToJson());
  Put("json", "list", Byte(3) + "[" + r.ToJson() + "]");
  Put("json", "bytes", Byte(4) + std::string("\x00\x7f\x80\xff text", 9));
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s CORPUS_DIR SOURCE_DIR\n", argv[0]);
    return 2;
  }
  lockstep::g_dir = argv[1];
  lockstep::Wire();
  lockstep::LogRecord();
  lockstep::LogInput();
  lockstep::Config(argv[2]);
  lockstep::ManifestSeeds();
  lockstep::ShimRing();
  lockstep::RespScan();
  lockstep::JsonSeeds();
  return 0;
}
