// leader_address.cc — taking and giving up the address that follows the
// leader (leader_address.h): ip, nftables, and a gratuitous ARP.
#include "guard/leader_address.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/if_ether.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>

#include "guard/netns_hosts.h"

namespace lockstep {

namespace {
constexpr const char* kTable = "lockstep_leader";  // nftables table of ours
}  // namespace

LeaderAddress::LeaderAddress(std::string addr, int port, std::string server_host, int server_port,
                             std::string interface, const ReplicaLog& log)
    : addr_(std::move(addr)),
      server_host_(std::move(server_host)),
      interface_(std::move(interface)),
      port_(port),
      server_port_(server_port),
      log_(log) {
  GiveUp();  // a predecessor that crashed while it led may have left it here
  thread_ = std::thread([this] {
    // The forwarding is in place from the start, on every replica: it only
    // sees packets for the address where the address is, and taking the
    // address is then one command (a leader's first clients wait less).
    std::string err;
    if (!Forward(&err))
      log_(
          "cannot forward the leader address %s to the server: %s (clients must find the "
          "leader by status)",
          addr_.c_str(), err.c_str());
    Run();
  });
}

LeaderAddress::~LeaderAddress() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  GiveUp();
  std::string ignored;
  RunTool("nft", {"delete", "table", "ip", kTable}, &ignored);
}

void LeaderAddress::Want(bool hold) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (want_ == hold) return;
    want_ = hold;
  }
  cv_.notify_all();
}

void LeaderAddress::Run() {
  bool held = false;
  // While held, the gratuitous ARP goes out again now and then: a client
  // that asked while a deposed leader still held the address (it answers
  // too, until it lets go) would otherwise keep the wrong MAC for seconds.
  constexpr std::chrono::milliseconds kReannounce[] = {std::chrono::milliseconds(200),
                                                       std::chrono::milliseconds(500),
                                                       std::chrono::milliseconds(1000)};
  size_t announced = 0;
  auto next_announce = std::chrono::steady_clock::time_point::max();
  for (;;) {
    bool want;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_until(l, next_announce, [&] { return stop_ || want_ != held; });
      if (stop_) return;
      want = want_;
    }
    if (want == held) {  // the timer: announce again
      if (held) AnnounceMove();
      auto step = kReannounce[std::min(announced++, std::size(kReannounce) - 1)];
      next_announce = std::chrono::steady_clock::now() + step;
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    std::string err;
    if (want && !Take(&err)) {
      log_("cannot take the leader address %s: %s (clients must find the leader by status)",
           addr_.c_str(), err.c_str());
      GiveUp();
      held = true;  // not retried until it is given up and wanted again
      next_announce = std::chrono::steady_clock::time_point::max();
      continue;
    }
    if (!want) GiveUp();
    held = want;
    announced = 0;
    next_announce = want ? std::chrono::steady_clock::now() + kReannounce[0]
                         : std::chrono::steady_clock::time_point::max();
    log_("%s the leader address %s:%d (%.0f ms)", want ? "took" : "gave up", addr_.c_str(), port_,
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
}

bool LeaderAddress::Forward(std::string* error) {
  const std::string table = kTable;
  std::string ignored;
  RunTool("nft", {"delete", "table", "ip", table}, &ignored);  // a predecessor's
  std::string dnat = server_host_ + ":" + std::to_string(server_port_);
  return RunTool("nft", {"add", "table", "ip", table}, error) &&
         RunTool("nft",
                 {"add", "chain", "ip", table, "pre",
                  "{ type nat hook prerouting priority -100 ; policy accept ; }"},
                 error) &&
         RunTool("nft",
                 {"add", "rule", "ip", table, "pre", "ip", "daddr", addr_, "tcp", "dport",
                  std::to_string(port_), "dnat", "to", dnat},
                 error);
}

bool LeaderAddress::Take(std::string* error) {
  if (!RunIp({"addr", "replace", addr_ + "/32", "dev", interface_}, error)) return false;
  AnnounceMove();
  return true;
}

void LeaderAddress::GiveUp() {
  std::string ignored;
  RunIp({"addr", "del", addr_ + "/32", "dev", interface_}, &ignored);
}

// A gratuitous ARP request (sender and target both the address) from this
// interface: hosts that knew the address at another replica's MAC update
// their entry, and the bridge learns where the MAC is.
void LeaderAddress::AnnounceMove() {
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ARP));
  if (fd < 0) {
    log_("gratuitous ARP for %s: socket: %s", addr_.c_str(), strerror(errno));
    return;
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, interface_.c_str(), IFNAMSIZ - 1);
  in_addr ip{};
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) != 0 || inet_pton(AF_INET, addr_.c_str(), &ip) != 1) {
    log_("gratuitous ARP for %s: no MAC address for %s", addr_.c_str(), interface_.c_str());
    close(fd);
    return;
  }
  unsigned char mac[ETH_ALEN];
  std::memcpy(mac, ifr.ifr_hwaddr.sa_data, ETH_ALEN);
  if (ioctl(fd, SIOCGIFINDEX, &ifr) != 0) {
    close(fd);
    return;
  }
  struct {
    ether_header eth;
    ether_arp arp;
  } __attribute__((packed)) frame{};
  std::memset(frame.eth.ether_dhost, 0xff, ETH_ALEN);
  std::memcpy(frame.eth.ether_shost, mac, ETH_ALEN);
  frame.eth.ether_type = htons(ETHERTYPE_ARP);
  frame.arp.arp_hrd = htons(ARPHRD_ETHER);
  frame.arp.arp_pro = htons(ETHERTYPE_IP);
  frame.arp.arp_hln = ETH_ALEN;
  frame.arp.arp_pln = 4;
  frame.arp.arp_op = htons(ARPOP_REQUEST);
  std::memcpy(frame.arp.arp_sha, mac, ETH_ALEN);
  std::memcpy(frame.arp.arp_spa, &ip, 4);
  std::memcpy(frame.arp.arp_tpa, &ip, 4);
  sockaddr_ll to{};
  to.sll_family = AF_PACKET;
  to.sll_ifindex = ifr.ifr_ifindex;
  to.sll_halen = ETH_ALEN;
  std::memset(to.sll_addr, 0xff, ETH_ALEN);
  for (int i = 0; i < 2; i++) {  // a second one in case the first met a full queue
    if (sendto(fd, &frame, sizeof frame, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) < 0)
      log_("gratuitous ARP for %s: %s", addr_.c_str(), strerror(errno));
    if (i == 0) usleep(20000);
  }
  close(fd);
}

}  // namespace lockstep
