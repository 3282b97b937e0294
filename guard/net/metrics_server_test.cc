// metrics_server_test.cc — the GET /metrics listener over real loopback
// sockets: what it answers, and that a stalled or oversized request costs
// only bounded time.
#include "guard/net/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "guard/net/test_ports.h"

namespace lockstep {
namespace {

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Sends request, reads until the server closes (or timeout_ms).
std::string Exchange(int port, const std::string& request, int timeout_ms = 5000) {
  int fd = Connect(port);
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return got;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    std::string err;
    ASSERT_TRUE(server_.Start("127.0.0.1", port_, &err)) << err;
  }
  int port_ = 0;
  MetricsServer server_{[] { return std::string("# TYPE x gauge\nx 1\n"); },
                        [](const std::string&) {}};
};

TEST_F(MetricsServerTest, GetMetricsIsAnsweredWithTheExposition) {
  std::string r = Exchange(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Length: 19\r\n"), std::string::npos) << r;
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "# TYPE x gauge\nx 1\n");
  EXPECT_EQ(server_.served(), 1u);
}

TEST_F(MetricsServerTest, AnythingElseIsRefused) {
  EXPECT_EQ(Exchange(port_, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404 ", 0), 0u);
  EXPECT_EQ(Exchange(port_, "GET /metricsx HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 404 ", 0), 0u);
  EXPECT_EQ(Exchange(port_, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405 ", 0), 0u);
  EXPECT_EQ(Exchange(port_, "hello\n\n").rfind("HTTP/1.1 400 ", 0), 0u);
  EXPECT_EQ(server_.served(), 0u);
  EXPECT_EQ(server_.refused(), 4u);
}

TEST_F(MetricsServerTest, AnOversizedRequestIsCutOff) {
  std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  auto t0 = std::chrono::steady_clock::now();
  std::string r = Exchange(port_, huge);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  // Either the 431 arrives, or the close resets the connection first.
  EXPECT_TRUE(r.empty() || r.rfind("HTTP/1.1 431 ", 0) == 0) << r.substr(0, 80);
  EXPECT_EQ(Exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 ", 0), 0u);
}

// A scraper that connects and says nothing holds the listener for
// kIoTimeoutMs at most; the next one is served after it.
TEST_F(MetricsServerTest, AStalledScraperIsDroppedAfterTheTimeout) {
  int idle = Connect(port_);
  auto t0 = std::chrono::steady_clock::now();
  std::string r = Exchange(port_, "GET /metrics HTTP/1.1\r\n\r\n", 10000);
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u) << r;
  EXPECT_LT(waited, std::chrono::milliseconds(MetricsServer::kIoTimeoutMs + 3000));
  char c;
  EXPECT_EQ(recv(idle, &c, 1, 0), 0);  // the idle one was closed
  close(idle);
}

TEST(MetricsServerStart, APortInUseIsAClearError) {
  int port = FreePort();
  MetricsServer a([] { return std::string(); }, [](const std::string&) {});
  MetricsServer b([] { return std::string(); }, [](const std::string&) {});
  std::string err;
  ASSERT_TRUE(a.Start("127.0.0.1", port, &err)) << err;
  EXPECT_FALSE(b.Start("127.0.0.1", port, &err));
  EXPECT_NE(err.find("cannot listen for metrics on 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("metrics_port"), std::string::npos) << err;
  EXPECT_FALSE(b.Start("not-an-ip", port, &err));
  EXPECT_NE(err.find("not an IPv4 address"), std::string::npos) << err;
}

}  // namespace
}  // namespace lockstep
