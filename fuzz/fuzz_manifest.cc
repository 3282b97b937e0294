// fuzz_manifest.cc — libFuzzer target for checkpoint/store.h: DecodeManifest
// on a checkpoint's MANIFEST (read back from disk, or from a checkpoint a
// peer sent). With the first byte odd, the target closes the fuzzer's text
// with the right `end <sha256>` line itself, so that the fuzzer explores the
// lines past the checksum. A decoded manifest encodes again and decodes to
// the same value.
#include <openssl/evp.h>

#include "checkpoint/store.h"
#include "fuzz/fuzz_util.h"

namespace {

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; i++) {
    hex += kHex[md[i] >> 4];
    hex += kHex[md[i] & 15];
  }
  return hex;
}

bool Same(const lockstep::Manifest& a, const lockstep::Manifest& b) {
  if (a.version != b.version || a.index != b.index || a.bytes != b.bytes ||
      a.meta.replica_id != b.meta.replica_id || a.meta.time_unix != b.meta.time_unix ||
      a.meta.dump_us != b.meta.dump_us || a.meta.extra != b.meta.extra ||
      a.entries.size() != b.entries.size())
    return false;
  for (size_t i = 0; i < a.entries.size(); i++) {
    const auto &x = a.entries[i], &y = b.entries[i];
    if (x.is_link != y.is_link || x.path != y.path || x.size != y.size ||
        x.sha256_hex != y.sha256_hex || x.link_target != y.link_target)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lockstep;
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += "end " + Sha256Hex(text) + "\n";
  }
  Manifest m;
  std::string error;
  if (!DecodeManifest(text, &m, &error)) {
    FUZZ_CHECK(!error.empty());
    return 0;
  }
  FUZZ_CHECK(m.version == CheckpointStore::kFormatVersion);
  std::string again = EncodeManifest(m);
  Manifest m2;
  FUZZ_CHECK(DecodeManifest(again, &m2, &error));
  FUZZ_CHECK(Same(m, m2));
  FUZZ_CHECK(EncodeManifest(m2) == again);
  return 0;
}
