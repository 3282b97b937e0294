// args.h — the command line of `lockstep` and its subcommands: --name value,
// --name=value, boolean --flag, the rest positional. Numbers are checked:
// a malformed one is an error naming the flag, never a silent zero. After
// `--` nothing is a flag: those arguments are positional and also kept
// apart in `rest` (for a command line such as `cluster up -- redis-server`).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace lockstep {

// A small flag parser: --name value, --name=value, --flag; the rest are positional.
struct Args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;  // including those after --
  bool dashdash = false;                // a `--` was given
  std::vector<std::string> rest;        // the arguments after --
  std::string error;
  bool Has(const std::string& k) const { return flags.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = flags.find(k);
    return it == flags.end() ? def : it->second;
  }
  // The flag's number, or def when absent; a malformed number sets error.
  long long IntOr(const std::string& k, long long def) {
    long long v = def;
    GetInt(k, def, &v);
    return v;
  }
  bool GetInt(const std::string& k, long long def, long long* out) {
    std::string v = Get(k);
    if (v.empty()) {
      *out = def;
      return true;
    }
    char* end;
    *out = strtoll(v.c_str(), &end, 10);
    if (*end) {
      error = "--" + k + " expects a number, got '" + v + "'";
      return false;
    }
    return true;
  }
};

inline Args Parse(int argc, char** argv, int start, const std::vector<std::string>& boolean_flags) {
  Args a;
  for (int i = start; i < argc; i++) {
    std::string s = argv[i];
    if (s == "--") {
      a.dashdash = true;
      for (i++; i < argc; i++) {
        a.positional.push_back(argv[i]);
        a.rest.push_back(argv[i]);
      }
      break;
    }
    if (s.rfind("--", 0) == 0) {
      std::string k = s.substr(2);
      size_t eq = k.find('=');
      if (eq != std::string::npos) {
        a.flags[k.substr(0, eq)] = k.substr(eq + 1);
      } else if (std::find(boolean_flags.begin(), boolean_flags.end(), k) != boolean_flags.end()) {
        a.flags[k] = "1";
      } else if (i + 1 < argc) {
        a.flags[k] = argv[++i];
      } else {
        a.error = "--" + k + " needs a value";
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

}  // namespace lockstep
