// leader_address.cc — taking and giving up the address that follows the
// leader (leader_address.h): ip, nftables, and a gratuitous ARP.
#include "guard/daemon/leader_address.h"

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

#include "guard/net/netns_hosts.h"

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
  // While held, the address's lease is renewed every kRenew (the kernel drops
  // it kLeaseSeconds after the last renewal: a leader whose daemon is stopped
  // or hung stops answering ARP for it by itself), and the gratuitous ARP
  // goes out again at kAnnounceAfter and then every second: a client that
  // asked while a deposed leader still held the address would otherwise keep
  // the wrong MAC until its entry went stale.
  using std::chrono::milliseconds;
  constexpr milliseconds kRenew(250);
  constexpr milliseconds kAnnounceAfter[] = {milliseconds(250), milliseconds(500),
                                             milliseconds(1000)};
  size_t announced = 0;
  auto next_renew = std::chrono::steady_clock::time_point::max();
  auto next_announce = next_renew;
  for (;;) {
    bool want;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_until(l, next_renew, [&] { return stop_ || want_ != held; });
      if (stop_) return;
      want = want_;
    }
    auto now = std::chrono::steady_clock::now();
    if (want == held) {  // the timer
      if (!held) continue;
      std::string err;
      if (!Lease(&err)) log_("cannot renew the leader address %s: %s", addr_.c_str(), err.c_str());
      next_renew = now + kRenew;
      if (now >= next_announce) {
        AnnounceMove();
        next_announce = now + kAnnounceAfter[std::min(announced++, std::size(kAnnounceAfter) - 1)];
      }
      continue;
    }
    std::string err;
    if (want && !Take(&err)) {
      log_("cannot take the leader address %s: %s (clients must find the leader by status)",
           addr_.c_str(), err.c_str());
      GiveUp();
      held = true;  // not retried until it is given up and wanted again
      next_renew = next_announce = std::chrono::steady_clock::time_point::max();
      continue;
    }
    if (!want) GiveUp();
    held = want;
    announced = 0;
    next_renew = want ? now + kRenew : std::chrono::steady_clock::time_point::max();
    next_announce = now + kAnnounceAfter[0];
    log_("%s the leader address %s:%d (%.0f ms)", want ? "took" : "gave up", addr_.c_str(), port_,
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - now).count());
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
         // Only where the address is local: a replica that let it go (or
         // whose lease ran out) must not take a client a stale ARP entry
         // still sends its way; unanswered, the client asks again.
         RunTool("nft",
                 {"add", "rule", "ip", table, "pre", "ip", "daddr", addr_, "fib", "daddr", "type",
                  "local", "tcp", "dport", std::to_string(port_), "dnat", "to", dnat},
                 error);
}

bool LeaderAddress::Lease(std::string* error) {
  const std::string lifetime = std::to_string(kLeaseSeconds);
  return RunIp({"addr", "replace", addr_ + "/32", "dev", interface_, "valid_lft", lifetime,
                "preferred_lft", lifetime},
               error);
}

bool LeaderAddress::Take(std::string* error) {
  if (!Lease(error)) return false;
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
