// app_profile_test.cc — LoadAppProfile on profiles written as ordinary TOML
// (multi-line strings, arrays over several lines, digit separators), on
// broken ones (each refused naming file:line:column), and on every profile
// apps/ ships.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "guard/cli/cluster.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

class AppProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("app_profile_test." + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Writes text as DIR/NAME.toml; its path, which LoadAppProfile takes as a profile of one's own.
  std::string Write(const std::string& text, const std::string& name = "mine") {
    std::string path = (dir_ / (name + ".toml")).string();
    std::ofstream(path) << text;
    return path;
  }
  fs::path dir_;
};

TEST_F(AppProfileTest, OrdinaryTomlReadsAsWritten) {
  std::string path = Write(R"(# a server of one's own
command = "my-server --port {port} --dir {dir}"  # {port}: the replica's
description = """
A server of one's own,
described over two lines."""
bench = '''
loadgen --port {port} # not a comment inside the string
'''
ready_timeout_ms = 20_000
same_random = true
same_clock = true # a comment after a value
timers_in_log = true
files = [
  "conf/server.conf",
  'conf/data.db',  # the trailing comma is fine
]
unchecked_replies = [
  "INFO",
  "CLIENT LIST",
]
state_probe = 'probe --port {port}'
state_check_every_s = 0x1e
)");
  AppProfile p;
  std::string error;
  ASSERT_TRUE(LoadAppProfile(LOCKSTEP_APPS_DIR, path, &p, &error)) << error;
  EXPECT_EQ(p.name, "mine");
  EXPECT_EQ(p.command, "my-server --port {port} --dir {dir}");
  EXPECT_EQ(p.description, "A server of one's own,\ndescribed over two lines.");
  EXPECT_EQ(p.bench, "loadgen --port {port} # not a comment inside the string\n");
  EXPECT_EQ(p.ready_timeout_ms, 20000u);
  EXPECT_TRUE(p.same_random && p.same_clock && p.timers_in_log);
  EXPECT_EQ(p.files, (std::vector<std::string>{"conf/server.conf", "conf/data.db"}));
  EXPECT_EQ(p.unchecked_replies, "INFO, CLIENT LIST");
  EXPECT_EQ(p.state_probe, "probe --port {port}");
  EXPECT_EQ(p.state_check_every_s, 30u);
}

TEST_F(AppProfileTest, BrokenProfilesNameFileLineAndColumn) {
  struct Case {
    std::string text, want;  // want: how the error begins, after the path
  } cases[] = {
      // a syntax error: the string's closing quote is missing
      {"command = \"srv\"\ndescription = \"no end\n", ":2:22: field 'description': "},
      // an unknown key
      {"command = \"srv\"\nflavor = 'mint'\n", ":2:1: unknown field 'flavor' in the top level"},
      // a wrong type
      {"command = \"srv\"\nsame_clock = 'yes'\n",
       ":2:14: field 'same_clock': expected true or false, got a string (\"yes\")"},
      // out of range
      {"command = \"srv\"\nready_timeout_ms = 99\n",
       ":2:20: field 'ready_timeout_ms': 99 is out of range 100..3600000"},
      // an inline table where a string is wanted
      {"command = { argv = ['srv'] }\n",
       ":1:11: field 'command': expected a string in quotes (\"...\" or '...'), got an inline "
       "table"},
      // a float, a section
      {"command = \"srv\"\nstate_check_every_s = 1.5\n",
       ":2:23: field 'state_check_every_s': expected an integer in 1..86400, got a float (1.5)"},
      {"command = \"srv\"\n\n[server]\nport = 1\n", ":3:1: unknown section [server]"},
      // a file out of the profile's folder, in a list over several lines
      {"command = \"srv\"\nfiles = [\n  'a.conf',\n  '/etc/passwd',\n]\n",
       ":4:3: field 'files': '/etc/passwd' is not a relative file path"},
      // and still the checks between fields
      {"command = \"srv\"\n\ntimers_in_log = true\n",
       ":3:17: field 'timers_in_log' needs same_clock = true"},
      {"description = \"no command\"\n", ":1:1: field 'command' missing in the top level"},
  };
  for (const Case& c : cases) {
    std::string path = Write(c.text, "broken");
    AppProfile p;
    std::string error;
    EXPECT_FALSE(LoadAppProfile(LOCKSTEP_APPS_DIR, path, &p, &error)) << c.text;
    EXPECT_EQ(error.rfind(path + c.want, 0), 0u) << "want " << path << c.want << "\ngot  " << error;
  }
}

// Every profile apps/ ships still loads.
TEST(AppProfiles, EveryShippedProfileLoads) {
  std::vector<std::string> names = ListAppProfiles(LOCKSTEP_APPS_DIR);
  EXPECT_GE(names.size(), 5u);
  for (const std::string& name : names) {
    AppProfile p;
    std::string error;
    EXPECT_TRUE(LoadAppProfile(LOCKSTEP_APPS_DIR, name, &p, &error)) << name << ": " << error;
    EXPECT_FALSE(p.command.empty()) << name;
  }
}

}  // namespace
}  // namespace lockstep
