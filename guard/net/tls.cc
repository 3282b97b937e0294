// tls.cc — see tls.h.
#include "guard/net/tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

namespace lockstep {

std::string KeysDir(const ClusterConfig& c) {
  std::filesystem::path keys = c.keys.empty() ? std::string("keys") : c.keys;
  if (keys.is_absolute()) return keys.string();
  std::filesystem::path base = std::filesystem::path(c.path).parent_path();
  return (base.empty() ? keys : base / keys).string();
}

std::string ReplicaCommonName(int id) {
  return "lockstep replica " + std::to_string(id);
}

namespace {

// OpenSSL's reasons for the last failure, oldest first, and the queue cleared.
std::string OpensslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    // "error:0A000086:SSL routines::certificate verify failed": the reason is
    // what a reader wants.
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += reason ? reason : buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

// The replica a certificate's subject names ("lockstep replica N"), or -1.
int ReplicaOf(X509* cert) {
  char cn[128] = "";
  if (!cert ||
      X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn) <= 0)
    return -1;
  const std::string prefix = ReplicaCommonName(0).substr(0, ReplicaCommonName(0).size() - 1);
  std::string s(cn);
  if (s.compare(0, prefix.size(), prefix) != 0 || s.size() == prefix.size() ||
      s.size() > prefix.size() + 6)
    return -1;
  int id = 0;
  for (size_t i = prefix.size(); i < s.size(); i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    id = id * 10 + (s[i] - '0');
  }
  return id;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::shared_ptr<TlsContext> TlsContext::Load(const std::string& keys_dir, int own_id,
                                             std::string* error) {
  const std::string how =
      " (the cluster's keys are made by `lockstep keys init --dir DIR`; a "
      "replica's host needs ca.crt and its own replica-N.crt and .key, a "
      "client's only ca.crt)";
  std::string ca = keys_dir + "/ca.crt";
  auto t = std::shared_ptr<TlsContext>(new TlsContext);
  t->ctx_ = SSL_CTX_new(TLS_method());
  if (!t->ctx_) {
    *error = "TLS: " + OpensslErrors();
    return nullptr;
  }
  SSL_CTX* ctx = t->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  // Session tickets would be data on an outbound peer connection, which
  // reads nothing (front_door.cc); nobody resumes sessions anyway.
  SSL_CTX_set_num_tickets(ctx, 0);
  // Like send(2): a write may take part of the buffer, and its retry may
  // come from another address (FrameConn's queue moves).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // A peer that closes without close_notify (killed) is a closed stream, as
  // on a plain socket: every frame carries its own length.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // One read(2) takes what the socket has, not a record header and then its
  // body: a read per frame, as without TLS.
  SSL_CTX_set_read_ahead(ctx, 1);
  // Connectors check the listener's certificate; listeners ask for one and
  // check what they get (none at all is allowed here: clients present none,
  // and the front door requires one from peers and replicas).
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!std::filesystem::exists(ca)) {
    *error = ca + ": no such file" + how;
    return nullptr;
  }
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    *error = ca + ": not a CA certificate: " + OpensslErrors();
    return nullptr;
  }
  if (own_id < 0) return t;

  std::string base = keys_dir + "/replica-" + std::to_string(own_id);
  std::string crt = base + ".crt", key = base + ".key";
  for (const std::string& f : {crt, key})
    if (!std::filesystem::exists(f)) {
      *error = f + ": no such file" + how;
      return nullptr;
    }
  struct stat st;
  if (stat(key.c_str(), &st) == 0 && (st.st_mode & 077)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    *error = key + ": readable by others (mode " + mode + "); a private key must be 0600";
    return nullptr;
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, crt.c_str()) != 1) {
    *error = crt + ": not a certificate: " + OpensslErrors();
    return nullptr;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    *error = key + ": not the key of " + crt + ": " + OpensslErrors();
    return nullptr;
  }
  // The wrong files are found here, not by every peer refusing them later.
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (ReplicaOf(cert) != own_id) {
    *error = crt + ": not replica " + std::to_string(own_id) + "'s certificate";
    return nullptr;
  }
  X509_STORE_CTX* check = X509_STORE_CTX_new();
  bool signed_by_ca = check &&
                      X509_STORE_CTX_init(check, SSL_CTX_get_cert_store(ctx), cert, nullptr) == 1 &&
                      X509_verify_cert(check) == 1;
  std::string why = check ? X509_verify_cert_error_string(X509_STORE_CTX_get_error(check)) : "";
  X509_STORE_CTX_free(check);
  if (!signed_by_ca) {
    *error = crt + ": not valid under " + ca + ": " + why;
    return nullptr;
  }
  return t;
}

std::shared_ptr<TlsContext> TlsContext::ForCluster(const ClusterConfig& c, int own_id,
                                                   std::string* error) {
  // Loaded again when the files changed: a process that outlives a cluster
  // (a benchmark starting one after another in one directory) meets new keys.
  auto identity = [](const std::string& path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return std::string("-");
    return std::to_string(st.st_ino) + "." + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec) + "." + std::to_string(st.st_size);
  };
  std::string dir = KeysDir(c);
  std::string files = identity(dir + "/ca.crt");
  if (own_id >= 0) files += "/" + identity(dir + "/replica-" + std::to_string(own_id) + ".crt");
  static std::mutex mu;
  static std::map<std::pair<std::string, int>, std::pair<std::string, std::shared_ptr<TlsContext>>>
      loaded;
  std::lock_guard<std::mutex> g(mu);
  auto& [seen, ctx] = loaded[{dir, own_id}];
  if (!ctx || seen != files) {
    ctx = Load(dir, own_id, error);
    seen = files;
  }
  return ctx;
}

TlsContext::~TlsContext() {
  SSL_CTX_free(ctx_);
}

// ------------------------------------------------------------------ Stream

Stream::Stream(int fd) : fd_(fd) {}

Stream::Stream(int fd, std::shared_ptr<TlsContext> tls, bool accepting)
    : fd_(fd), tls_(std::move(tls)) {
  ssl_ = SSL_new(tls_->ctx());
  if (ssl_) {
    SSL_set_fd(ssl_, fd_);
    if (accepting)
      SSL_set_accept_state(ssl_);
    else
      SSL_set_connect_state(ssl_);
  } else {
    error_ = "TLS: " + OpensslErrors();
  }
}

Stream::~Stream() {
  // No close_notify: the other end learns of the close from the socket, and
  // a shutdown that blocks or fails helps nobody here.
  SSL_free(ssl_);
  if (fd_ >= 0) close(fd_);
}

ssize_t Stream::Fail(int ret, const char* what) {
  int saved = errno;
  int e = SSL_get_error(ssl_, ret);
  wants_write_ = e == SSL_ERROR_WANT_WRITE;
  switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE: errno = EAGAIN; return -1;
    case SSL_ERROR_ZERO_RETURN: return 0;
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      if (saved == 0 || saved == EPIPE || saved == ECONNRESET) return 0;
      error_ = std::string(what) + ": " + strerror(saved);
      errno = saved;
      return -1;
    default: {
      error_ = std::string("TLS ") + what + ": " + OpensslErrors();
      long v = SSL_get_verify_result(ssl_);
      if (v != X509_V_OK) error_ += std::string(" (") + X509_verify_cert_error_string(v) + ")";
      errno = EPROTO;
      return -1;
    }
  }
}

ssize_t Stream::Read(void* buf, size_t n) {
  if (!ssl_) {
    if (!tls_) {
      ssize_t r;
      do r = read(fd_, buf, n);
      while (r < 0 && errno == EINTR);
      return r;
    }
    errno = EPROTO;
    return -1;
  }
  ERR_clear_error();
  errno = 0;
  int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (r > 0) {
    wants_write_ = false;
    return r;
  }
  return Fail(r, "read");
}

ssize_t Stream::Write(const void* buf, size_t n) {
  if (!ssl_) {
    if (!tls_) {
      ssize_t r;
      do r = send(fd_, buf, n, MSG_NOSIGNAL);
      while (r < 0 && errno == EINTR);
      return r;
    }
    errno = EPROTO;
    return -1;
  }
  if (n == 0) return 0;
  ERR_clear_error();
  errno = 0;
  int r = SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (r > 0) {
    wants_write_ = false;
    return r;
  }
  ssize_t got = Fail(r, "write");
  if (got == 0) {  // a write cannot see a clean end: the peer is gone
    errno = EPIPE;
    error_ = "write: connection closed by the peer";
    return -1;
  }
  return got;
}

bool Stream::has_buffered() const {
  return ssl_ && SSL_has_pending(ssl_);
}

int Stream::HandshakeStep() {
  if (!ssl_) return tls_ ? -1 : 1;
  ERR_clear_error();
  errno = 0;
  int r = SSL_do_handshake(ssl_);
  if (r == 1) return 1;
  ssize_t f = Fail(r, "handshake");
  if (f == 0) {
    error_ = "connection closed during the TLS handshake";
    return -1;
  }
  return errno == EAGAIN ? 0 : -1;
}

bool Stream::Handshake(int timeout_ms) {
  int64_t deadline = NowMs() + timeout_ms;
  for (;;) {
    int step = HandshakeStep();
    if (step != 0) return step == 1;
    int64_t left = deadline - NowMs();
    if (left <= 0) {
      error_ = "timed out in the TLS handshake";
      return false;
    }
    pollfd p{fd_, static_cast<short>(wants_write_ ? POLLOUT : POLLIN), 0};
    poll(&p, 1, static_cast<int>(left));
  }
}

int Stream::peer_replica() const {
  if (!ssl_ || !SSL_is_init_finished(ssl_) || SSL_get_verify_result(ssl_) != X509_V_OK) return -1;
  return ReplicaOf(SSL_get0_peer_certificate(ssl_));
}

}  // namespace lockstep
