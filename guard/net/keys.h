// keys.h — `lockstep keys init`: a cluster's own certificate authority and a
// certificate per replica, which the daemons' TLS (guard/net/tls.h) proves and
// checks identities with. Made once per cluster (`cluster up` makes them when
// the cluster directory has none), in DIR/keys:
//
//   ca.crt          the CA's certificate: every host needs it, clients too
//   ca.key          the CA's key: only for making certificates; keep it off the replicas
//   replica-N.crt   replica N's certificate ("lockstep replica N"), signed by the CA
//   replica-N.key   its key: only replica N's host needs it
//
// Keys are ECDSA P-256; certificates are valid for ten years. Every file is
// written 0600 in a directory 0700, under a temporary name first: an
// interrupted run leaves no half set behind.
#pragma once

#include <string>

namespace lockstep {

// Makes a CA and certificates for replicas 0..replicas-1 in dir (which must
// not exist yet). False with *error when it cannot.
bool MakeClusterKeys(const std::string& dir, int replicas, std::string* error);

// Makes replica id's certificate and key in dir, signed with its ca.key (a
// replica added later: lockstep member add). True at once when it exists.
bool MakeReplicaKey(const std::string& dir, int id, std::string* error);

}  // namespace lockstep
