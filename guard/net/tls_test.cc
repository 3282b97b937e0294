// tls_test.cc — the cluster's keys (keys.h) and TLS streams (tls.h) over
// socketpairs: who the other end proves to be, and the clear errors for
// keys that cannot be used.
#include "guard/net/tls.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "guard/net/keys.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() / ("tls_test-" + std::to_string(getpid()));
    fs::remove_all(tmp_);
    std::string err;
    ASSERT_TRUE(MakeClusterKeys((tmp_ / "a").string(), 3, &err)) << err;
    ASSERT_TRUE(MakeClusterKeys((tmp_ / "b").string(), 3, &err)) << err;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  std::shared_ptr<TlsContext> Load(const char* cluster, int id) {
    std::string err;
    auto t = TlsContext::Load((tmp_ / cluster).string(), id, &err);
    EXPECT_TRUE(t) << err;
    return t;
  }
  // Connects `connector` to `listener` over a socketpair; both handshakes'
  // results, and what each end saw of the other.
  struct Outcome {
    bool listener_ok, connector_ok;
    int listener_saw, connector_saw;
    std::string listener_error, connector_error;
  };
  Outcome Pair(std::shared_ptr<TlsContext> listener, std::shared_ptr<TlsContext> connector) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    Stream l(fds[0], listener, /*accepting=*/true);
    Stream c(fds[1], connector, /*accepting=*/false);
    Outcome o{};
    std::thread t([&] {
      o.listener_ok = l.Handshake(3000);
      o.listener_error = l.error();
      // TLS 1.3: the connector learns of a refused certificate on its next read.
      if (o.listener_ok) l.Write("x", 1);
    });
    o.connector_ok = c.Handshake(3000);
    char got = 0;
    if (o.connector_ok) {
      for (int i = 0; i < 300 && c.Read(&got, 1) < 0 && errno == EAGAIN; i++) usleep(10000);
      o.connector_ok = got == 'x';
    }
    o.connector_error = c.error();
    t.join();
    o.listener_saw = l.peer_replica();
    o.connector_saw = c.peer_replica();
    return o;
  }
  fs::path tmp_;
};

TEST_F(Tls, ReplicasProveWhoTheyAreAndClientsOnlyCheckTheListener) {
  Outcome o = Pair(Load("a", 0), Load("a", 2));
  EXPECT_TRUE(o.listener_ok && o.connector_ok) << o.listener_error << o.connector_error;
  EXPECT_EQ(o.listener_saw, 2);
  EXPECT_EQ(o.connector_saw, 0);
  // A client presents nothing, and still checks the listener.
  o = Pair(Load("a", 1), Load("a", -1));
  EXPECT_TRUE(o.listener_ok && o.connector_ok) << o.listener_error << o.connector_error;
  EXPECT_EQ(o.listener_saw, -1);
  EXPECT_EQ(o.connector_saw, 1);
}

TEST_F(Tls, AnotherClustersCertificateIsRefusedEitherWay) {
  // The stranger distrusts the listener first, and says so ("unknown ca").
  // (A stranger that trusts this CA and presents its own certificate is
  // refused by the daemon: tests/test_bad_input.py.)
  Outcome o = Pair(Load("a", 0), Load("b", 1));
  EXPECT_FALSE(o.listener_ok);
  EXPECT_NE(o.listener_error.find("unknown ca"), std::string::npos) << o.listener_error;
  EXPECT_FALSE(o.connector_ok);
  o = Pair(Load("b", 0), Load("a", 1));  // the listener is
  EXPECT_FALSE(o.connector_ok);
  EXPECT_NE(o.connector_error.find("certificate verify failed"), std::string::npos)
      << o.connector_error;
}

TEST_F(Tls, KeysThatCannotBeUsedAreClearErrors) {
  std::string err;
  EXPECT_FALSE(TlsContext::Load((tmp_ / "none").string(), -1, &err));
  EXPECT_NE(err.find("none/ca.crt: no such file"), std::string::npos) << err;
  EXPECT_NE(err.find("lockstep keys init"), std::string::npos) << err;
  EXPECT_FALSE(TlsContext::Load((tmp_ / "a").string(), 3, &err));
  EXPECT_NE(err.find("replica-3.crt: no such file"), std::string::npos) << err;
  // Replica 1's files under replica 0's names.
  fs::copy_file(tmp_ / "a" / "replica-1.crt", tmp_ / "a" / "replica-0.crt",
                fs::copy_options::overwrite_existing);
  EXPECT_FALSE(TlsContext::Load((tmp_ / "a").string(), 0, &err));
  EXPECT_NE(err.find("not the key of"), std::string::npos) << err;
  fs::copy_file(tmp_ / "a" / "replica-1.key", tmp_ / "a" / "replica-0.key",
                fs::copy_options::overwrite_existing);
  EXPECT_FALSE(TlsContext::Load((tmp_ / "a").string(), 0, &err));
  EXPECT_NE(err.find("not replica 0's certificate"), std::string::npos) << err;
  // Another cluster's certificate under this CA.
  fs::copy_file(tmp_ / "b" / "replica-1.crt", tmp_ / "a" / "replica-1.crt",
                fs::copy_options::overwrite_existing);
  fs::copy_file(tmp_ / "b" / "replica-1.key", tmp_ / "a" / "replica-1.key",
                fs::copy_options::overwrite_existing);
  EXPECT_FALSE(TlsContext::Load((tmp_ / "a").string(), 1, &err));
  EXPECT_NE(err.find("not valid under"), std::string::npos) << err;
  chmod((tmp_ / "a" / "replica-2.key").c_str(), 0640);
  EXPECT_FALSE(TlsContext::Load((tmp_ / "a").string(), 2, &err));
  EXPECT_NE(err.find("mode 0640"), std::string::npos) << err;
  EXPECT_FALSE(MakeClusterKeys((tmp_ / "a").string(), 3, &err));
  EXPECT_NE(err.find("already exists"), std::string::npos) << err;
}

}  // namespace
}  // namespace lockstep
