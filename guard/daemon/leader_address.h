// leader_address.h — an address that follows the leader (cluster.toml
// `leader_address`, made by `cluster up --hosts netns`): clients connect
// there and reach whichever replica serves them now, without reading
// status. The replica that serves clients owns it, as keepalived's virtual
// addresses are owned: the address goes on its interface, connections to
// it are forwarded (nftables DNAT) to its server's own address and port,
// and a gratuitous ARP tells the network where it moved. A replica that
// stops serving (steps down, loses its majority for an election timeout,
// or starts up after a crash) gives it up; one that cannot (its daemon
// stopped or hung) loses it within a second, since the address is a lease
// the kernel drops unless renewed.
//
// Two replicas may hold it for a moment (a leader cut off from its peers
// keeps it for an election timeout). Clients that reach that one are not
// served anything unagreed (it cannot commit, and its server refuses them
// once it steps down); the new leader's gratuitous ARPs move every client
// that can reach it.
//
// The `ip` and `nft` commands run on a thread of this class, so the
// daemon's loop never waits for them; each change converges to the last
// one asked for.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "guard/common/replica_log.h"

namespace lockstep {

class LeaderAddress {
 public:
  // addr: the leader address ("10.201.7.5"), port: the port clients use on
  // it; forwarded to server_host:server_port on this replica's interface.
  LeaderAddress(std::string addr, int port, std::string server_host, int server_port,
                std::string interface, const ReplicaLog& log);
  ~LeaderAddress();  // gives the address up, then stops the thread
  LeaderAddress(const LeaderAddress&) = delete;
  LeaderAddress& operator=(const LeaderAddress&) = delete;

  // Hold the address (this replica serves clients) or not. Cheap; the
  // thread carries it out.
  void Want(bool hold);

 private:
  void Run();
  bool Forward(std::string* error);  // the DNAT of addr_:port_ to the server
  bool Lease(std::string* error);    // (re)adds the address for kLeaseSeconds
  bool Take(std::string* error);
  static constexpr int kLeaseSeconds = 1;
  void GiveUp();
  void AnnounceMove();  // gratuitous ARP for addr_ from interface_

  const std::string addr_, server_host_, interface_;
  const int port_, server_port_;
  const ReplicaLog& log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool want_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace lockstep
