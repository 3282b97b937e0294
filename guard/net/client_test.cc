// client_test.cc — the client's side of a checkpoint fetch against a hostile
// peer (a thread here speaking the wire protocol): what it sends must stay
// inside the destination directory.
#include "guard/net/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "guard/net/keys.h"
#include "guard/net/tls.h"
#include "guard/net/wire.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

// A cluster's keys, made once for this test binary.
const fs::path& Keys() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("client_test-keys-" + std::to_string(getpid()));
    fs::remove_all(d);
    std::string err;
    EXPECT_TRUE(MakeClusterKeys(d.string(), 2, &err)) << err;
    return d;
  }();
  // Registered after dir exists, so run before its destructor.
  static bool removed_at_exit = (atexit([] { fs::remove_all(Keys()); }), true);
  (void)removed_at_exit;
  return dir;
}

// Listens on 127.0.0.1 as replica 0 (with its certificate: the attacker is
// a replica, or holds one's keys), accepts one connection, lets it
// authenticate without checking, and answers a checkpoint fetch with `parts`.
class HostilePeer {
 public:
  explicit HostilePeer(std::vector<CheckpointPart> parts) : parts_(std::move(parts)) {
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(listen_, 1);
    thread_ = std::thread([this] { Serve(); });
  }
  ~HostilePeer() {
    thread_.join();
    close(listen_);
  }
  int port() const { return port_; }

 private:
  void Serve() {
    std::string err;
    auto tls = TlsContext::Load((Keys()).string(), 0, &err);
    ASSERT_TRUE(tls) << err;
    Stream s(accept(listen_, nullptr, nullptr), tls, /*accepting=*/true);
    ASSERT_TRUE(s.Handshake(5000)) << s.error();
    FrameKind kind;
    std::string body;
    ReadFrame(s, &kind, &body, 5000, &err);  // HELLO
    WriteFrame(s, FrameKind::kChallenge, std::string(32, 'n'), &err);
    ReadFrame(s, &kind, &body, 5000, &err);  // AUTH
    WriteFrame(s, FrameKind::kWelcome, "", &err);
    ReadFrame(s, &kind, &body, 5000, &err);  // FETCH_CHECKPOINT
    for (const auto& p : parts_)
      WriteFrame(s, FrameKind::kCheckpointPart, EncodeCheckpointPart(p), &err);
    WriteFrame(s, FrameKind::kCheckpointDone, EncodeCheckpointDone({true, 7, ""}), &err);
    // Until the client is done with it.
    while (ReadFrame(s, &kind, &body, 5000, &err)) {
    }
  }
  std::vector<CheckpointPart> parts_;
  int listen_ = -1, port_ = 0;
  std::thread thread_;
};

// Replica 0 at `port`, as replica 1 sees it (the keys beside the config).
ClusterConfig TwoReplicas(int port) {
  ClusterConfig c;
  c.secret = c.client_secret = c.admin_secret = "0123456789abcdef0123";
  c.path = (Keys() / "cluster.toml").string();
  c.keys = ".";
  for (int id = 0; id < 2; id++) {
    ReplicaConfig r;
    r.id = id;
    r.host = "127.0.0.1";
    r.client_port = id == 0 ? port : 1;
    c.replicas.push_back(r);
  }
  return c;
}

std::string Fetch(const std::vector<CheckpointPart>& parts, const fs::path& dest) {
  HostilePeer peer(parts);
  std::string err;
  auto client =
      Client::Connect(TwoReplicas(peer.port()), 0, 2000, &err, Principal::kReplica, /*own_id=*/1);
  EXPECT_TRUE(client) << err;
  if (!client) return err;
  uint64_t index = 0, bytes = 0;
  if (client->FetchCheckpoint(0, dest.string(), &index, &bytes, &err)) return "";
  return err;
}

TEST(CheckpointFetch, NothingIsWrittenThroughASymlinkThePeerSent) {
  fs::path tmp = fs::temp_directory_path() / ("client_test-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "outside");
  std::string err = Fetch(
      {{"x", true, 0, (tmp / "outside").string()}, {"x/evil", false, 0, "pwned"}}, tmp / "dest");
  EXPECT_NE(err.find("outside the checkpoint"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(tmp / "outside" / "evil"));
  fs::remove_all(tmp);
}

// The last component too: a symlink part "x" -> a file outside, then a
// file part "x", wrote through the link (open without O_NOFOLLOW).
TEST(CheckpointFetch, AFileIsNotWrittenThroughASymlinkOfTheSameName) {
  fs::path tmp = fs::temp_directory_path() / ("client_test3-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  { std::ofstream(tmp / "victim") << "intact"; }
  std::string err =
      Fetch({{"x", true, 0, (tmp / "victim").string()}, {"x", false, 0, "pwned"}}, tmp / "dest");
  EXPECT_NE(err.find("cannot create"), std::string::npos) << err;
  std::ifstream f(tmp / "victim");
  std::string got((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(got, "intact");
  fs::remove_all(tmp);
}

TEST(CheckpointFetch, AbsoluteDotDotAndHugeOffsetsAreRefused) {
  fs::path tmp = fs::temp_directory_path() / ("client_test2-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  EXPECT_NE(Fetch({{"/etc/x", false, 0, "a"}}, tmp / "d1").find("outside"), std::string::npos);
  EXPECT_NE(Fetch({{"img/../../x", false, 0, "a"}}, tmp / "d2").find("outside"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "x"));
  std::string err = Fetch({{"img/pages", false, 1ull << 60, "a"}}, tmp / "d3");
  EXPECT_NE(err.find("beyond any checkpoint"), std::string::npos) << err;
  // A well-formed one arrives whole: the checks refuse only what they should.
  EXPECT_EQ(Fetch({{"img/pages", false, 0, "abc"}, {"MANIFEST", false, 0, "m"}}, tmp / "d4"), "");
  std::ifstream f(tmp / "d4" / "img" / "pages");
  std::string got((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(got, "abc");
  fs::remove_all(tmp);
}

// CRIU refuses to restore an open file whose mode is not the dumped one's
// (MariaDB's ddl_recovery.log is 0660): a fetched file keeps the sender's
// mode exactly, whatever our umask; a mode beyond the permission bits is
// malformed.
TEST(CheckpointFetch, FilesKeepTheSendersMode) {
  fs::path tmp = fs::temp_directory_path() / ("client_test3-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  mode_t old_umask = umask(022);
  EXPECT_EQ(
      Fetch({{"data/ddl_recovery.log", false, 0, "x", 0660}, {"data/ro", false, 0, "y", 0400}},
            tmp / "d"),
      "");
  umask(old_umask);
  EXPECT_EQ(fs::status(tmp / "d" / "data" / "ddl_recovery.log").permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::group_write);
  EXPECT_EQ(fs::status(tmp / "d" / "data" / "ro").permissions(), fs::perms::owner_read);
  EXPECT_NE(Fetch({{"data/x", false, 0, "a", 04755}}, tmp / "d2").find("malformed"),
            std::string::npos);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace lockstep
