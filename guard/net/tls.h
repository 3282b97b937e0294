// tls.h — TLS on every connection to a daemon (OpenSSL): the cluster's keys
// as loaded by a process (TlsContext), and a connected socket with a TLS
// session over it (Stream), which FrameConn and the blocking helpers of
// wire.h read and write instead of the socket.
//
// Who proves what (the keys are made by `lockstep keys init`, guard/net/keys.h):
// - every listener (a replica's peer and client ports) presents its
//   replica's certificate, and whoever connects checks that it was signed by
//   the cluster's CA and names the replica it meant to reach;
// - a daemon connecting to a peer (the peer port; a status or checkpoint
//   fetch on the client port) presents its own replica's certificate, and
//   the listener refuses it unless the certificate names the replica id its
//   HELLO gives;
// - a client or an admin presents no certificate: it proves its secret in
//   the HELLO/AUTH exchange that follows (front_door.cc), now inside TLS, so
//   nothing it sends can be read or changed on the way.
// A certificate names its replica in its subject's common name,
// "lockstep replica N" (ReplicaCommonName).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "guard/common/config.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace lockstep {

// The directory a cluster's keys live in: `keys` of cluster.toml, relative to
// its own directory, by default "keys" beside it.
std::string KeysDir(const ClusterConfig& c);
// "lockstep replica N": the common name of replica N's certificate.
std::string ReplicaCommonName(int id);

class TlsContext {
 public:
  // The cluster's CA (KEYS/ca.crt) and, for own_id >= 0, replica own_id's
  // certificate and key (KEYS/replica-N.crt, .key). Null with a clear error
  // (which file, why, and how to make it) when one cannot be used.
  static std::shared_ptr<TlsContext> Load(const std::string& keys_dir, int own_id,
                                          std::string* error);
  // Load, once per (directory, id) in this process while its files stay the same.
  static std::shared_ptr<TlsContext> ForCluster(const ClusterConfig& c, int own_id,
                                                std::string* error);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* ctx() const { return ctx_; }

 private:
  TlsContext() = default;
  SSL_CTX* ctx_ = nullptr;
};

// A connected non-blocking socket, and the TLS session over it unless it was
// made plain (only the frame reader's fuzzer does). Owns the fd.
class Stream {
 public:
  // Plain: reads and writes go to the socket as they are.
  explicit Stream(int fd);
  // TLS as the listener (accepting) or the connector. The handshake runs
  // within the first Read or Write (or Handshake, blocking).
  Stream(int fd, std::shared_ptr<TlsContext> tls, bool accepting);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int fd() const { return fd_; }
  // As read(2) and send(2) on a non-blocking socket: > 0 bytes, 0 the peer
  // closed, -1 with errno (EAGAIN: later, when the socket is readable, or
  // writable if wants_write(); EPROTO: TLS failed, error() says why).
  ssize_t Read(void* buf, size_t n);
  ssize_t Write(const void* buf, size_t n);
  // Bytes TLS has taken from the socket and not yet handed out: read on
  // even when the socket says nothing more (level-triggered polls miss them).
  bool has_buffered() const;
  // The last call returned EAGAIN because TLS must send before it can go on.
  bool wants_write() const { return wants_write_; }
  // Completes the handshake, polling, within timeout_ms (false: error()).
  bool Handshake(int timeout_ms);
  // One step of the handshake, without blocking: 1 done, 0 to go on once
  // the socket is readable (writable if wants_write()), -1 failed (error()).
  int HandshakeStep();
  // The replica whose certificate the other end presented and the CA
  // verified; -1 when it presented none (or the stream is plain).
  int peer_replica() const;
  const std::string& error() const { return error_; }

 private:
  ssize_t Fail(int ret, const char* what);  // maps SSL_get_error to the above
  int fd_;
  SSL* ssl_ = nullptr;
  std::shared_ptr<TlsContext> tls_;  // keeps the SSL_CTX alive
  bool wants_write_ = false;
  std::string error_;
};

}  // namespace lockstep
