// command_line.cc — splitting and joining command lines (command_line.h).
#include "guard/common/command_line.h"

#include <cctype>
#include <cstring>

namespace lockstep {

bool SplitCommand(const std::string& cmd, std::vector<std::string>* argv, std::string* error) {
  std::vector<std::string> out;
  std::string cur;
  bool in_arg = false;
  char quote = 0;
  for (size_t i = 0; i < cmd.size(); i++) {
    char c = cmd[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        cur += c;
      }
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < cmd.size() && (cmd[i + 1] == '"' || cmd[i + 1] == '\\')) {
        cur += cmd[++i];
      } else {
        cur += c;
      }
    } else if (isspace(static_cast<unsigned char>(c))) {
      if (in_arg) out.push_back(cur);
      cur.clear();
      in_arg = false;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_arg = true;
    } else if (c == '\\') {
      if (i + 1 == cmd.size()) {
        *error = "command ends with a lone backslash: " + cmd;
        return false;
      }
      cur += cmd[++i];
      in_arg = true;
    } else {
      cur += c;
      in_arg = true;
    }
  }
  if (quote) {
    *error = std::string("unbalanced ") + quote + " in command: " + cmd;
    return false;
  }
  if (in_arg) out.push_back(cur);
  *argv = std::move(out);
  return true;
}

std::string JoinCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty();
    for (char c : a)
      if (!isalnum(static_cast<unsigned char>(c)) && !strchr("-_./:=,+@%{}", c)) plain = false;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

}  // namespace lockstep
