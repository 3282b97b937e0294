// keys.cc — see keys.h.
#include "guard/net/keys.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "guard/net/tls.h"

namespace lockstep {

namespace {

constexpr long kValidDays = 3650;

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

bool Fail(const std::string& what, std::string* error) {
  char buf[256] = "";
  unsigned long e = ERR_get_error();
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  *error = what + (e ? std::string(": ") + buf : std::string());
  return false;
}

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX v3;
  X509V3_set_ctx(&v3, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
  if (!ext) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `common_name`, signed by issuer_key (and
// issuer's name; itself when issuer is null: the CA).
Cert MakeCert(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key,
              std::string* error) {
  Cert cert(X509_new());
  unsigned char serial[16];
  BIGNUM* bn = nullptr;
  bool ok = cert && RAND_bytes(serial, sizeof serial) == 1;
  serial[0] &= 0x7f;  // positive
  ok = ok && (bn = BN_bin2bn(serial, sizeof serial, nullptr)) != nullptr &&
       BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  ok = ok && X509_set_version(cert.get(), 2) == 1 &&
       X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) &&
       X509_time_adj_ex(X509_getm_notAfter(cert.get()), kValidDays, 0, nullptr) &&
       X509_set_pubkey(cert.get(), key) == 1;
  X509_NAME* name = cert ? X509_get_subject_name(cert.get()) : nullptr;
  ok = ok &&
       X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>("lockstep"), -1, -1,
                                  0) == 1 &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                  -1, 0) == 1;
  X509* signer = issuer ? issuer : cert.get();
  ok = ok && X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) == 1;
  if (ok && !issuer) {
    ok = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
         AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash");
  } else if (ok) {
    ok = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE") &&
         AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature") &&
         AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth") &&
         AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid");
  }
  ok = ok && X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0;
  if (!ok) {
    Fail("cannot make the certificate of " + common_name, error);
    return nullptr;
  }
  return cert;
}

// Writes a PEM file 0600 (a new file: O_EXCL).
bool WritePem(const std::string& path, EVP_PKEY* key, X509* cert, std::string* error) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *error = path + ": cannot create: " + strerror(errno);
    return false;
  }
  FILE* f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    *error = path + ": cannot open: " + strerror(errno);
    return false;
  }
  bool ok = key ? PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1
                : PEM_write_X509(f, cert) == 1;
  ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok) return Fail(path + ": cannot write", error);
  return true;
}

// The one certificate of replica `id` into dir (its files must not exist).
bool WriteReplicaKey(const std::string& dir, int id, X509* ca, EVP_PKEY* ca_key,
                     std::string* error) {
  Pkey key(EVP_EC_gen("P-256"));
  if (!key) return Fail("cannot make replica " + std::to_string(id) + "'s key", error);
  Cert cert = MakeCert(key.get(), ReplicaCommonName(id), ca, ca_key, error);
  std::string base = dir + "/replica-" + std::to_string(id);
  return cert && WritePem(base + ".key", key.get(), nullptr, error) &&
         WritePem(base + ".crt", nullptr, cert.get(), error);
}

}  // namespace

bool MakeReplicaKey(const std::string& dir, int id, std::string* error) {
  std::string base = dir + "/replica-" + std::to_string(id);
  if (access((base + ".crt").c_str(), F_OK) == 0) return true;  // made by an earlier try
  FILE* f = fopen((dir + "/ca.key").c_str(), "r");
  if (!f) {
    *error = dir + "/ca.key: cannot open: " + strerror(errno) +
             " (a replica's certificate is signed with the cluster CA's key)";
    return false;
  }
  Pkey ca_key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  fclose(f);
  f = fopen((dir + "/ca.crt").c_str(), "r");
  if (!f) {
    *error = dir + "/ca.crt: cannot open: " + strerror(errno);
    return false;
  }
  Cert ca(PEM_read_X509(f, nullptr, nullptr, nullptr));
  fclose(f);
  if (!ca_key || !ca) return Fail("cannot read the cluster CA in " + dir, error);
  // A key without its certificate (an interrupted try): made again.
  unlink((base + ".key").c_str());
  return WriteReplicaKey(dir, id, ca.get(), ca_key.get(), error);
}

bool MakeClusterKeys(const std::string& dir, int replicas, std::string* error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    *error = dir +
             " already exists: a cluster's keys are made once (remove it to make new "
             "ones, and give every host its new files)";
    return false;
  }
  if (replicas < 1) {
    *error = "no replicas to make keys for";
    return false;
  }
  std::string staging = dir + ".making";
  fs::remove_all(staging, ec);
  fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec) && !fs::create_directories(parent, ec)) {
    *error = parent.string() + ": cannot create: " + ec.message();
    return false;
  }
  if (mkdir(staging.c_str(), 0700) != 0) {
    *error = staging + ": cannot create: " + strerror(errno);
    return false;
  }
  auto abandon = [&](bool ok) {
    if (!ok) fs::remove_all(staging, ec);
    return ok;
  };
  Pkey ca_key(EVP_EC_gen("P-256"));
  if (!ca_key) return abandon(Fail("cannot make the CA's key", error));
  Cert ca = MakeCert(ca_key.get(), "lockstep cluster CA", nullptr, ca_key.get(), error);
  if (!ca || !WritePem(staging + "/ca.key", ca_key.get(), nullptr, error) ||
      !WritePem(staging + "/ca.crt", nullptr, ca.get(), error))
    return abandon(false);
  for (int id = 0; id < replicas; id++)
    if (!WriteReplicaKey(staging, id, ca.get(), ca_key.get(), error)) return abandon(false);
  if (rename(staging.c_str(), dir.c_str()) != 0) {
    *error = "cannot rename " + staging + " to " + dir + ": " + strerror(errno);
    return abandon(false);
  }
  return true;
}

}  // namespace lockstep
