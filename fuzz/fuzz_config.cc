// fuzz_config.cc — libFuzzer target for guard/common/config.h: ParseClusterConfig on
// a cluster.toml, and ParseToml (toml++ underneath) with the typed getters
// the app profiles (apps/*.toml) use. A config that parses is written out
// again (FormatClusterConfig), and that must parse to the same config.
#include "fuzz/fuzz_util.h"
#include "guard/common/config.h"

namespace {

void ClusterToml(const std::string& text) {
  using namespace lockstep;
  ClusterConfig c;
  std::string error;
  if (!ParseClusterConfig(text, "fuzz.toml", &c, &error)) {
    FUZZ_CHECK(!error.empty());
    return;
  }
  FUZZ_CHECK(!c.replicas.empty() && c.replicas.size() <= 7);
  FUZZ_CHECK(!c.client_secret.empty());
  std::string formatted = FormatClusterConfig(c);
  ClusterConfig c2;
  if (!ParseClusterConfig(formatted, "fuzz.toml", &c2, &error)) {
    fprintf(stderr, "formatted config does not parse: %s\n%s\n", error.c_str(), formatted.c_str());
    FUZZ_CHECK(false);
  }
  FUZZ_CHECK(FormatClusterConfig(c2) == formatted);
}

// Every field through every getter, as a profile loader might ask for it.
void AnyToml(const std::string& text, bool top_level) {
  using namespace lockstep;
  std::vector<TomlTable> tables;
  std::string error;
  if (!ParseToml(text, "fuzz.toml", {"[cluster]", "[server]", "[checkpoint]", "[[replica]]"},
                 top_level, &tables, &error)) {
    FUZZ_CHECK(!error.empty());
    return;
  }
  for (TomlTable& t : tables) {
    std::vector<std::string> keys;
    for (const auto& f : t.fields) keys.push_back(f.first);
    for (const std::string& k : keys) {
      std::string s, why;
      int64_t n = 0;
      bool b = false;
      std::vector<std::string> files;
      t.TakeString(k, &s, true, &why);
      t.TakeInt(k, &n, true, -1000, 1000, &why);
      t.TakeBool(k, &b, &why);
      t.TakeFileList(k, &files, &why);
      for (const std::string& f : files)
        FUZZ_CHECK(!f.empty() && f[0] != '/' && f != ".." && f.rfind("../", 0) != 0);
      FUZZ_CHECK(t.At(k).line >= 1 && t.At(k).column >= 1);
    }
    std::string replies, why;
    t.TakeUncheckedReplies(&replies, &why);
    t.NoLeftovers(&why);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: ClusterToml(text); break;
    case 1: AnyToml(text, true); break;
    case 2: AnyToml(text, false); break;
  }
  return 0;
}
