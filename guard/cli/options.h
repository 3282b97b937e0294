// options.h — what every `lockstep` command's command line shares, on top of
// CLI11: the help layout (every option with its default; a command family's
// subcommands in full, prose included), validators whose errors name the
// values allowed, typed option helpers, and running the parsed command with
// the exit codes lockstep has always given (0 help, 1 a bad value, 2 a
// command line of the wrong shape).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace lockstep {

// The arguments after the first `--`, which CLI11 never sees: `cluster up`
// takes them as the server's command line exactly as given; propose and
// failpoint as more values (one starting with '-' can only come that way).
struct AfterDashDash {
  bool given = false;
  std::vector<std::string> args;
};

// `--dir DIR | --config FILE`: which cluster a command talks to.
struct ClusterRef {
  std::string dir;  // empty: DefaultClusterDir()
  std::string config;
};

class HelpFormatter;

class CommandLine {
 public:
  CommandLine();
  CLI::App& root() { return root_; }
  const AfterDashDash& rest() const { return rest_; }

  // A command (or a subcommand of a family such as `cluster`). usage_tail
  // goes after the generated usage line (e.g. "[-- SERVER COMMAND...]");
  // footer: the prose printed after the options.
  CLI::App* Add(CLI::App* parent, const std::string& name, const std::string& description,
                const std::string& footer = "", const std::string& usage_tail = "");
  // What the command runs once its line parsed. A usage error (an unknown or
  // missing option, a stray argument) exits usage_exit, a bad value
  // value_exit: the codes the command gave before it was parsed by CLI11.
  void OnRun(CLI::App* command, std::function<int()> run, int value_exit = 1, int usage_exit = 2);
  // The command reads rest() (the arguments after `--`); any other command
  // refuses them.
  void TakesRest(CLI::App* command) { takes_rest_.insert(command); }

  // Parses argv, runs the command; returns the process's exit code.
  int Run(int argc, char** argv);

 private:
  struct Runner {
    std::function<int()> run;
    int value_exit, usage_exit;
  };
  int Error(const CLI::App* at, const CLI::ParseError& e);
  CLI::App root_;
  std::shared_ptr<HelpFormatter> formatter_;
  std::map<const CLI::App*, Runner> runners_;
  std::set<const CLI::App*> takes_rest_;
  AfterDashDash rest_;
};

// "lockstep cluster up": the words that name app on the command line.
std::string CommandPath(const CLI::App* app);

// Validators; each one's error names the value and what is allowed, and
// CLI11 puts the option's name in front ("--replicas: 4 is not 3, 5 or 7").
CLI::Validator OneOf(const std::vector<std::string>& allowed);
// A comma-separated list whose every item is one of allowed ("shm,tcp").
CLI::Validator ListOf(const std::vector<std::string>& allowed);
// For a number with no upper limit.
constexpr long long kNoLimit = 0x7fffffffffffffffLL;
// A whole number in lo..hi; except, when given, a value that means "the
// default" (0 for --ready-timeout-ms).
CLI::Validator WholeNumber(long long lo, long long hi);
CLI::Validator WholeNumberOr(long long except, long long lo, long long hi);
// A comma-separated list of whole numbers, each in lo..hi.
CLI::Validator NumberList(long long lo, long long hi);

// Typed options: the value is checked (WholeNumber) before it is converted,
// so a malformed one is an error naming the option, never a silent zero.
// shown_default: what the help says the default is, when the variable's
// initial value does not say it (a sentinel such as -1).
CLI::Option* AddNumber(CLI::App* app, const std::string& name, long long* value,
                       const std::string& description, long long lo, long long hi,
                       const std::string& shown_default = "");
// --dir DIR and --config FILE, which exclude each other.
void AddClusterRef(CLI::App* app, ClusterRef* ref);
std::string DefaultDirShown();  // "$LOCKSTEP_DIR or /tmp/lockstep-cluster"

// The non-empty items of a comma-separated list ("a,,b": a and b).
std::vector<std::string> SplitCommas(const std::string& s);

}  // namespace lockstep
