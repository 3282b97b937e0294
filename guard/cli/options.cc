// options.cc — the command line machinery every `lockstep` command shares
// (options.h): help layout, validators, typed options, parse-and-run.
#include "guard/cli/options.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace lockstep {

namespace {

bool ParseWhole(const std::string& s, long long* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end;
  *v = strtoll(s.c_str(), &end, 10);
  return *end == 0 && errno == 0;
}

// "a, b or c"
std::string Alternatives(const std::vector<std::string>& allowed) {
  std::string out;
  for (size_t i = 0; i < allowed.size(); i++)
    out += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  return out;
}

std::string RangeError(const std::string& v, long long lo, long long hi) {
  long long n;
  if (!ParseWhole(v, &n)) return "'" + v + "' is not a whole number";
  if (hi == kNoLimit && n < lo) return v + " is less than " + std::to_string(lo);
  if (n < lo || n > hi) return v + " is not in " + std::to_string(lo) + ".." + std::to_string(hi);
  return "";
}

// Greedy word wrap of each line of text to width columns (help descriptions).
std::string Wrap(const std::string& text, size_t width) {
  std::string out, line;
  std::stringstream lines(text);
  bool first_line = true;
  while (std::getline(lines, line)) {
    if (!first_line) out += "\n";
    first_line = false;
    size_t col = 0;
    std::stringstream words(line);
    std::string word;
    while (words >> word) {
      if (col > 0 && col + 1 + word.size() > width) {
        out += "\n";
        col = 0;
      } else if (col > 0) {
        out += " ";
        col++;
      }
      out += word;
      col += word.size();
    }
  }
  return out;
}

constexpr size_t kHelpWidth = 100;

}  // namespace

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The help of every command: its description, a usage line, every option
// with its default, the prose of the footer; a family (`cluster`, `bench`)
// shows each of its subcommands in full, so `lockstep cluster --help` says
// everything about `cluster up` too.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() {
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("REQUIRED", "(required)");
    label("Positionals", "Arguments");
    column_width(36);
  }
  std::map<const CLI::App*, std::string> usage_tail;

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    std::ostringstream out;
    out << make_description(app) << make_usage(app, CommandPath(app)) << make_positionals(app)
        << make_groups(app, mode);
    auto subs = app->get_subcommands({});
    if (app->get_parent() == nullptr) {
      out << make_subcommands(app, mode);
    } else {
      for (const CLI::App* sub : subs) out << "\n" << make_help(sub, "", mode);
    }
    std::string footer = make_footer(app);
    if (!footer.empty()) out << "\n" << footer;
    std::string help = out.str();
    while (help.find("\n\n\n") != std::string::npos) help.replace(help.find("\n\n\n"), 3, "\n\n");
    return help;
  }

  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string line = get_label("Usage") + ": " + name;
    if (app->get_parent() == nullptr) return line + " COMMAND [options]\n";
    auto subs = app->get_subcommands({});
    if (!subs.empty()) {
      std::string names;
      for (const CLI::App* sub : subs) names += (names.empty() ? "" : "|") + sub->get_name();
      return line + " " + names + " [options]\n";
    }
    line += " [options]";
    for (const CLI::Option* opt : app->get_options({}))
      if (opt->get_positional() && !opt->get_group().empty()) line += " " + make_option_usage(opt);
    auto tail = usage_tail.find(app);
    if (tail != usage_tail.end()) line += " " + tail->second;
    return line + "\n";
  }

  // "N" instead of "N=3": the default goes at the end of the description.
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty() && opt->nonpositional())
      out += " " + opt->get_type_name();
    if (opt->get_required() && opt->nonpositional()) out += " " + get_label("REQUIRED");
    return out;
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    if (opt->get_type_size() != 0 && !opt->get_default_str().empty() && !opt->get_required() &&
        opt->nonpositional())
      desc += " (default " + opt->get_default_str() + ")";
    return Wrap(desc, kHelpWidth - get_column_width());
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    std::ostringstream out;
    CLI::detail::format_help(out, sub->get_name(),
                             Wrap(sub->get_description(), kHelpWidth - get_column_width()),
                             get_column_width());
    return out.str();
  }
};

std::string CommandPath(const CLI::App* app) {
  std::string path;
  for (const CLI::App* a = app; a; a = a->get_parent())
    path = a->get_name() + (path.empty() ? "" : " ") + path;
  return path;
}

CommandLine::CommandLine()
    : root_("lockstep — replicate an unmodified server through Paxos", "lockstep"),
      formatter_(std::make_shared<HelpFormatter>()) {
  root_.formatter(formatter_);
  root_.set_help_flag("-h,--help", "print this help (every option, with its default) and exit");
  root_.require_subcommand(1);
  // An option given twice: the last one counts, as it always did.
  root_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  root_.footer("lockstep COMMAND --help lists the command's options, with their defaults.");
}

CLI::App* CommandLine::Add(CLI::App* parent, const std::string& name,
                           const std::string& description, const std::string& footer,
                           const std::string& usage_tail) {
  CLI::App* app = parent->add_subcommand(name, description);
  app->formatter(formatter_);
  app->group("Commands");
  if (!footer.empty()) app->footer(footer);
  if (!usage_tail.empty()) formatter_->usage_tail[app] = usage_tail;
  return app;
}

void CommandLine::OnRun(CLI::App* command, std::function<int()> run, int value_exit,
                        int usage_exit) {
  runners_[command] = Runner{std::move(run), value_exit, usage_exit};
}

int CommandLine::Error(const CLI::App* at, const CLI::ParseError& e) {
  std::string path = CommandPath(at);
  auto subs = at->get_subcommands({});
  std::string names;
  for (const CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
  std::string what = e.what();
  std::vector<std::string> left = root_.remaining(true);  // what no command took
  if (subs.empty() && !left.empty() && dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // CLI11 lists them last first; in the order given they read better.
    what = left.size() == 1 ? "unexpected argument '" + left[0] + "'" : "unexpected arguments:";
    if (left.size() > 1)
      for (const auto& a : left) what += " '" + a + "'";
  }
  // A family (or lockstep itself) given no command, or one it lacks: say
  // which there are, in lockstep's words rather than CLI11's.
  if (!subs.empty()) {
    if (!left.empty()) {
      what = "unknown command '" + left[0] + "' (" + names + ")";
    } else if (dynamic_cast<const CLI::RequiredError*>(&e) &&
               what.find("subcommand") != std::string::npos) {
      what = "which command? (" + names + ")";
    }
  }
  fprintf(stderr, "%s: %s\n%s(`%s --help` lists every option, with its default)\n", path.c_str(),
          what.c_str(), formatter_->make_usage(at, path).c_str(), path.c_str());
  auto r = runners_.find(at);
  // An option without its value was a bad value before CLI11 too.
  bool bad_value = dynamic_cast<const CLI::ConversionError*>(&e) ||
                   dynamic_cast<const CLI::ValidationError*>(&e) ||
                   dynamic_cast<const CLI::ArgumentMismatch*>(&e);
  if (r == runners_.end()) return 2;
  return bad_value ? r->second.value_exit : r->second.usage_exit;
}

int CommandLine::Run(int argc, char** argv) {
  // `lockstep` alone: the commands, on stderr (it did nothing asked of it).
  if (argc < 2) {
    fprintf(stderr, "%s", root_.help().c_str());
    return 2;
  }
  std::string first = argv[1];
  if (first == "help") {
    printf("%s", root_.help().c_str());
    return 0;
  }
  // Everything from the first `--` on is not CLI11's to read (rest()).
  std::vector<std::string> args;
  for (int i = 1; i < argc; i++) {
    if (!rest_.given && std::string(argv[i]) == "--") {
      rest_.given = true;
      continue;
    }
    (rest_.given ? rest_.args : args).push_back(argv[i]);
  }
  std::reverse(args.begin(), args.end());  // CLI11 reads a reversed vector
  // The deepest command named on the line: the one an error or --help is about.
  auto deepest = [this] {
    const CLI::App* at = &root_;
    for (;;) {
      auto parsed = at->get_subcommands();
      if (parsed.empty()) return at;
      at = parsed.back();
    }
  };
  try {
    root_.parse(args);
  } catch (const CLI::CallForHelp&) {
    printf("%s", deepest()->help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    printf("%s", deepest()->help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    return Error(deepest(), e);
  }
  const CLI::App* at = deepest();
  auto r = runners_.find(at);
  if (r == runners_.end()) {  // a family with no runner of its own: CLI11 required one
    fprintf(stderr, "%s: which command?\n", CommandPath(at).c_str());
    return 2;
  }
  if (rest_.given && !rest_.args.empty() && !takes_rest_.count(at)) {
    std::string path = CommandPath(at);
    fprintf(stderr,
            "%s: unexpected argument '%s' after -- (only `cluster up`, propose and failpoint "
            "take arguments there)\n%s",
            path.c_str(), rest_.args[0].c_str(), formatter_->make_usage(at, path).c_str());
    return r->second.usage_exit;
  }
  return r->second.run();
}

CLI::Validator OneOf(const std::vector<std::string>& allowed) {
  return CLI::Validator(
      [allowed](std::string& v) -> std::string {
        for (const auto& a : allowed)
          if (v == a) return "";
        return "'" + v + "' is not " + Alternatives(allowed);
      },
      "");
}

CLI::Validator ListOf(const std::vector<std::string>& allowed) {
  return CLI::Validator(
      [allowed](std::string& v) -> std::string {
        auto items = SplitCommas(v);
        if (items.empty()) return "an empty list";
        for (const auto& item : items) {
          bool ok = false;
          for (const auto& a : allowed) ok = ok || item == a;
          if (!ok) return "'" + item + "' is not " + Alternatives(allowed);
        }
        return "";
      },
      "");
}

CLI::Validator WholeNumber(long long lo, long long hi) {
  return CLI::Validator([lo, hi](std::string& v) { return RangeError(v, lo, hi); }, "");
}

CLI::Validator WholeNumberOr(long long except, long long lo, long long hi) {
  return CLI::Validator(
      [except, lo, hi](std::string& v) -> std::string {
        long long n;
        if (ParseWhole(v, &n) && n == except) return "";
        std::string err = RangeError(v, lo, hi);
        return err.empty() || err.find("whole") != std::string::npos
                   ? err
                   : v + " is not " + std::to_string(except) + " nor in " + std::to_string(lo) +
                         ".." + std::to_string(hi);
      },
      "");
}

CLI::Validator NumberList(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        auto items = SplitCommas(v);
        if (items.empty()) return "an empty list";
        for (const auto& item : items)
          if (std::string err = RangeError(item, lo, hi); !err.empty()) return err;
        return "";
      },
      "");
}

CLI::Option* AddNumber(CLI::App* app, const std::string& name, long long* value,
                       const std::string& description, long long lo, long long hi,
                       const std::string& shown_default) {
  CLI::Option* o = app->add_option(name, *value, description);
  o->type_name("N")->check(WholeNumber(lo, hi));
  if (!shown_default.empty()) {
    o->default_str(shown_default);
  } else {
    o->capture_default_str();
  }
  return o;
}

std::string DefaultDirShown() {
  return "$LOCKSTEP_DIR or /tmp/lockstep-cluster";
}

void AddClusterRef(CLI::App* app, ClusterRef* ref) {
  CLI::Option* dir = app->add_option("--dir", ref->dir, "the cluster's directory (cluster.toml)")
                         ->type_name("DIR")
                         ->default_str(DefaultDirShown());
  app->add_option("--config", ref->config, "its cluster.toml elsewhere (instead of --dir)")
      ->type_name("FILE")
      ->excludes(dir);
}

}  // namespace lockstep
