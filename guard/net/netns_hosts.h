// netns_hosts.h — separate "hosts" on one machine for `lockstep cluster up
// --hosts netns`: one network namespace per replica (its daemon and its
// server), one for clients, and a hub namespace holding the bridge they all
// hang off by veth pairs. Each replica and the client side get an address of
// their own on a /24 that exists only inside these namespaces, so the
// replicas talk TCP (UCX over tcp too) as over a real network, and a replica
// can be cut off by taking its link down in the hub.
//
// The names are written to DIR/netns before anything is made, so that
// `cluster down` removes them all even after the tool crashed half-way
// (RemoveNetnsHosts). Nothing here touches the caller's own namespace but
// to leave it (EnterNetns).
#pragma once

#include <string>
#include <vector>

namespace lockstep {

struct NetnsHosts {
  std::string hub;                    // holds the bridge
  std::string client;                 // where clients (and the CLI) run
  std::vector<std::string> replicas;  // replica i's namespace
  std::string prefix;                 // "10.201.X.": the /24 (its .0/24)

  std::string ReplicaAddr(int i) const { return prefix + std::to_string(10 + i); }
  // The address that follows the leader (guard/daemon/leader_address.h).
  std::string LeaderAddr() const { return prefix + "5"; }
  std::string ClientAddr() const { return prefix + "100"; }
};

// The namespaces and addresses for the cluster in dir (names and subnet
// from a hash of its absolute path: two clusters never share them).
NetnsHosts PlanNetnsHosts(const std::string& dir, int replicas);

// Makes them (removing leftovers of the same names first): lo up in each,
// the bridge in the hub, a veth pair from each replica and the client
// namespace to it, addresses, IPv6 off. False with *error naming the step
// and `ip`'s words; whatever was made stays listed in DIR/netns.
bool CreateNetnsHosts(const std::string& dir, const NetnsHosts& hosts, std::string* error);

// The replicas' firewall (nftables, in each replica's namespace): from an
// address that is not a replica's, only the ports in open_ports[i] (its
// client and server ports) answer; everything else, the peer port and the
// ports UCX listens on above all, is dropped. UCX's tcp transport checks no
// key at the target: whoever reaches its port can write into a replica's
// log region, so only the replicas may. False with *error naming the command.
bool FirewallReplicaHosts(const NetnsHosts& hosts, const std::vector<std::vector<int>>& open_ports,
                          std::string* error);

// Keeps the cluster's ports out of the kernel's choice of ephemeral ports in
// each replica's namespace (net.ipv4.ip_local_reserved_ports): a port the
// kernel gave an outgoing connection or a UCX listener first would leave a
// server that binds it later "Address already in use" (gerbera's ports are
// 49152 and up, inside the default ephemeral range). False with *error
// naming the command.
bool ReserveReplicaPorts(const NetnsHosts& hosts, const std::vector<int>& ports,
                         std::string* error);

// A replica added later (`lockstep member add`): its namespace, on the
// bridge at ReplicaAddr(id), listed in DIR/netns, with the same firewall
// and reserved ports as the others; every running replica's firewall lets
// the new address in. hosts must be PlanNetnsHosts for the cluster, with
// replicas[id] its name. False with *error naming the step.
bool AddNetnsReplicaHost(const std::string& dir, const NetnsHosts& hosts, int id,
                         const std::vector<int>& open_ports, const std::vector<int>& reserved_ports,
                         std::string* error);

// Removes every namespace listed in DIR/netns that still exists (their
// interfaces go with them), killing by pid any process left inside first,
// then the file. True when there was nothing to remove.
bool RemoveNetnsHosts(const std::string& dir, bool quiet, std::string* error);

// Moves the calling thread into namespace `name` (/run/netns/NAME); threads
// it starts afterwards are there too.
bool EnterNetns(const std::string& name, std::string* error);

// Runs `ip ARGS...` (no shell); false with *error = the command and its
// output when it fails.
bool RunIp(const std::vector<std::string>& args, std::string* error);
// The same for another system tool ("nft"), found in the sbin directories too.
bool RunTool(const std::string& name, const std::vector<std::string>& args, std::string* error);

}  // namespace lockstep
