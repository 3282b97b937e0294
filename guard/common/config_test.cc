// config_test.cc — ParseToml (toml++ underneath), its typed getters and
// ParseClusterConfig: ordinary TOML reads as written, and whatever lockstep
// does not take is refused with PATH:LINE:COLUMN and a way to fix it.
#include "guard/common/config.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

// A profile's shape: fields at the top level, no sections.
TomlTable ParseTop(const std::string& text) {
  std::vector<TomlTable> tables;
  std::string error;
  EXPECT_TRUE(ParseToml(text, "p.toml", {}, true, &tables, &error)) << error;
  EXPECT_EQ(tables.size(), 1u);
  return tables.empty() ? TomlTable{} : tables[0];
}

// The error ParseToml gives for text, "" if it parses.
std::string ParseError(const std::string& text, bool top_level = true,
                       const std::vector<std::string>& headers = {}) {
  std::vector<TomlTable> tables;
  std::string error;
  if (ParseToml(text, "p.toml", headers, top_level, &tables, &error)) return "";
  return error;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

TEST(ParseToml, ReadsOrdinaryToml) {
  TomlTable t = ParseTop(R"(# how a profile may be written
command = "redis-server --port {port}"   # a comment after a value
description = """
Redis, replicated:
every replica's copy alike."""
bench = '''
C:\no\escapes "here"
'''
ready_timeout_ms = 20_000
same_random = true # comment
files = [
  "redis/state_probe.sh",   # one a line
  'sub/b.ndb',
]
unchecked_replies = [
  "INFO",
  "CLIENT LIST",  # two words: one command
]
)");
  std::string command, description, bench, replies;
  int64_t timeout = 0;
  bool same_random = false;
  std::vector<std::string> files;
  std::string error;
  ASSERT_TRUE(t.TakeString("command", &command, true, &error)) << error;
  ASSERT_TRUE(t.TakeString("description", &description, false, &error)) << error;
  ASSERT_TRUE(t.TakeString("bench", &bench, false, &error)) << error;
  ASSERT_TRUE(t.TakeInt("ready_timeout_ms", &timeout, false, 100, 3600000, &error)) << error;
  ASSERT_TRUE(t.TakeBool("same_random", &same_random, &error)) << error;
  ASSERT_TRUE(t.TakeFileList("files", &files, &error)) << error;
  ASSERT_TRUE(t.TakeUncheckedReplies(&replies, &error)) << error;
  EXPECT_TRUE(t.NoLeftovers(&error)) << error;
  EXPECT_EQ(command, "redis-server --port {port}");
  // TOML drops the newline right after the opening quotes
  EXPECT_EQ(description, "Redis, replicated:\nevery replica's copy alike.");
  EXPECT_EQ(bench, "C:\\no\\escapes \"here\"\n");
  EXPECT_EQ(timeout, 20000);
  EXPECT_TRUE(same_random);
  EXPECT_EQ(files, (std::vector<std::string>{"redis/state_probe.sh", "sub/b.ndb"}));
  EXPECT_EQ(replies, "INFO, CLIENT LIST");  // the form the shim reads
  EXPECT_EQ(t.At("files").line, 11);
  EXPECT_EQ(t.At("files").column, 9);
}

TEST(ParseToml, ListsStillTakeOneStringWithCommas) {
  TomlTable t = ParseTop(
      "files = \"clamd/clamd.conf, clamd/lockstep.ndb\"\n"
      "unchecked_replies = \"INFO, CLIENT LIST\"\n");
  std::vector<std::string> files;
  std::string replies, error;
  ASSERT_TRUE(t.TakeFileList("files", &files, &error)) << error;
  ASSERT_TRUE(t.TakeUncheckedReplies(&replies, &error)) << error;
  EXPECT_EQ(files, (std::vector<std::string>{"clamd/clamd.conf", "clamd/lockstep.ndb"}));
  EXPECT_EQ(replies, "INFO, CLIENT LIST");
}

TEST(ParseToml, AnEmptyArrayIsAnEmptyList) {
  TomlTable t = ParseTop("files = []\nunchecked_replies = [ ]\n");
  std::vector<std::string> files = {"stale"};
  std::string replies = "stale", error;
  ASSERT_TRUE(t.TakeFileList("files", &files, &error)) << error;
  EXPECT_TRUE(files.empty());
  ASSERT_TRUE(t.TakeUncheckedReplies(&replies, &error)) << error;
  EXPECT_EQ(replies, "");  // as unchecked_replies = "": every reply compared
}

// toml++ 3.3 reaches __builtin_unreachable() asking whether some non-ASCII
// characters are whitespace (U+00BA after a value, U+00A7 after a line-ending
// backslash; found by fuzz_config): config.cc hides them from it and gives
// them back, so they are an ordinary error where TOML forbids them, and
// themselves inside strings and keys.
TEST(ParseToml, NonAsciiThatTomlpp33CannotClassify) {
  std::string e = ParseError("x = 20\xc2\xba\n");
  EXPECT_TRUE(StartsWith(e, "p.toml:1:7: field 'x': ")) << e;
  EXPECT_EQ(e.find("\xee"), std::string::npos) << e;  // no placeholder shows
  TomlTable t =
      ParseTop("\"k\xc2\xa7\" = \"\"\"\\\n  \xc2\xa7 caf\xc3\xa9 \xef\xb9\xb0 \\uE000\"\"\"\n");
  std::string v, error;
  ASSERT_TRUE(t.TakeString("k\xc2\xa7", &v, true, &error)) << error;
  EXPECT_EQ(v, "\xc2\xa7 caf\xc3\xa9 \xef\xb9\xb0 \xee\x80\x80");
}

TEST(ParseToml, IntegersInEveryTomlForm) {
  TomlTable t = ParseTop("a = 0x1F\nb = 0o17\nc = 0b101\nd = +5\ne = -1_000\n");
  std::string error;
  int64_t n = 0;
  for (auto [key, want] :
       {std::pair<const char*, int64_t>{"a", 31}, {"b", 15}, {"c", 5}, {"d", 5}, {"e", -1000}}) {
    ASSERT_TRUE(t.TakeInt(key, &n, true, -10000, 10000, &error)) << error;
    EXPECT_EQ(n, want) << key;
  }
}

TEST(ParseToml, SyntaxErrorsNameLineColumnFieldAndFix) {
  // an unquoted string: toml++ stops where the number it read goes wrong
  std::string e = ParseError("command = \"x\"\nhost = 127.0.0.1\n");
  EXPECT_TRUE(StartsWith(e, "p.toml:2:13: field 'host': ")) << e;
  EXPECT_NE(e.find("needs quotes"), std::string::npos) << e;
  e = ParseError("a = 1\nb = \"\"\"never closed\n");
  EXPECT_TRUE(StartsWith(e, "p.toml:2:21: field 'b': ")) << e;
  EXPECT_NE(e.find("missing?"), std::string::npos) << e;
  e = ParseError("a = \"C:\\q\"\n");
  EXPECT_TRUE(StartsWith(e, "p.toml:1:9: field 'a': ")) << e;
  EXPECT_NE(e.find("literal string"), std::string::npos) << e;
  e = ParseError("a = 1\na = 2\n");
  EXPECT_TRUE(StartsWith(e, "p.toml:2:5: field 'a': ")) << e;
  EXPECT_NE(e.find("only once"), std::string::npos) << e;
  e = ParseError("[cluster]\nsecret = \"x\"\n[cluster]\n", false, {"[cluster]"});
  EXPECT_TRUE(StartsWith(e, "p.toml:3:1: section [cluster]: ")) << e;
}

// Runs the getter for one field as a profile loader would, then
// NoLeftovers; the first error (ParseToml's, if it refuses the text).
std::string GetterError(const std::string& text, const std::string& key) {
  std::vector<TomlTable> tables;
  std::string s, proto, error;
  if (!ParseToml(text, "p.toml", {}, true, &tables, &error)) return error;
  if (tables.empty()) return "no fields";
  TomlTable& t = tables[0];
  int64_t n = 0;
  bool b = false;
  std::vector<std::string> files;
  if (key == "port") t.TakeInt(key, &n, true, 1, 65535, &error);
  if (key == "name") t.TakeString(key, &s, true, &error);
  if (key == "flag") t.TakeBool(key, &b, &error);
  if (key == "files") t.TakeFileList(key, &files, &error);
  if (key == "unchecked_replies") t.TakeUncheckedReplies(&s, &error);
  if (key == "inspect_commands") t.TakeCommandList(key, false, &s, &error);
  if (key == "lease_reads") t.TakeLeaseReads(&proto, &s, &error);
  if (error.empty()) t.NoLeftovers(&error);
  return error;
}

TEST(ParseToml, WhatLockstepDoesNotTakeIsRefusedWithLineAndColumn) {
  EXPECT_EQ(GetterError("\nport = 70000\n", "port"),
            "p.toml:2:8: field 'port': 70000 is out of range 1..65535");
  EXPECT_EQ(GetterError("port = '7000'\n", "port"),
            "p.toml:1:8: field 'port': expected an integer in 1..65535, got a string (\"7000\")");
  EXPECT_EQ(GetterError("port = 7000.0\n", "port"),
            "p.toml:1:8: field 'port': expected an integer in 1..65535, got a float (7000)");
  EXPECT_EQ(GetterError("name = { first = \"a\" }\n", "name"),
            "p.toml:1:8: field 'name': expected a string in quotes (\"...\" or '...'), got an "
            "inline table { ... }");
  EXPECT_EQ(GetterError("name = 1979-05-27\n", "name"),
            "p.toml:1:8: field 'name': expected a string in quotes (\"...\" or '...'), got a date");
  EXPECT_EQ(GetterError("name.first = 'a'\n", "name"),
            "p.toml:1:1: field 'name': expected a string in quotes (\"...\" or '...'), got a "
            "dotted key's table");
  EXPECT_EQ(GetterError("flag = 1\n", "flag"),
            "p.toml:1:8: field 'flag': expected true or false, got an integer (1)");
  // a list's bad entry is named where it stands
  EXPECT_EQ(GetterError("files = [\n  'a.conf',\n  '../x',\n]\n", "files"),
            "p.toml:3:3: field 'files': '../x' is not a relative file path (none may be empty, "
            "absolute or climb out with '..')");
  EXPECT_TRUE(StartsWith(GetterError("files = 'a, /etc/passwd'\n", "files"),
                         "p.toml:1:9: field 'files': '/etc/passwd' is not a relative"));
  EXPECT_TRUE(StartsWith(GetterError("files = [1, 2]\n", "files"),
                         "p.toml:1:9: field 'files': expected relative file paths"));
  EXPECT_TRUE(StartsWith(
      GetterError("unchecked_replies = ['INFO', 'CLIENT LIST, DEBUG']\n", "unchecked_replies"),
      "p.toml:1:30: field 'unchecked_replies': \"CLIENT LIST, DEBUG\" is not "
      "one command"));
  EXPECT_TRUE(StartsWith(GetterError("unchecked_replies = 'INFO,'\n", "unchecked_replies"),
                         "p.toml:1:21: field 'unchecked_replies': expected commands"));
  // inspect_commands: as unchecked_replies, but any number of them; an
  // empty list would read as none (every byte passes), so it is refused
  std::string many = "inspect_commands = [";
  for (int i = 0; i < 40; i++) many += "'C" + std::to_string(i) + "', ";
  EXPECT_EQ(GetterError(many + "'DEBUG DIGEST']\n", "inspect_commands"), "");
  EXPECT_TRUE(StartsWith(GetterError("inspect_commands = []\n", "inspect_commands"),
                         "p.toml:1:20: field 'inspect_commands': expected commands"));
  EXPECT_TRUE(StartsWith(GetterError("inspect_commands = 'GET,,SET'\n", "inspect_commands"),
                         "p.toml:1:20: field 'inspect_commands': expected commands"));
  // lease_reads: RESP commands by default; with lease_protocol = "memcached",
  // some of get, gets, mg (the reads preload/mc_scan.h knows the replies of)
  EXPECT_EQ(GetterError("lease_reads = ['GET', 'MGET']\n", "lease_reads"), "");
  EXPECT_EQ(GetterError("lease_protocol = 'resp'\nlease_reads = 'GET'\n", "lease_reads"), "");
  EXPECT_EQ(GetterError("lease_protocol = 'memcached'\nlease_reads = ['get', 'gets', 'mg']\n",
                        "lease_reads"),
            "");
  EXPECT_EQ(GetterError("lease_protocol = 'memcached'\nlease_reads = 'get, mg'\n", "lease_reads"),
            "");
  EXPECT_EQ(GetterError("lease_protocol = 'http'\nlease_reads = 'GET'\n", "lease_reads"),
            "p.toml:1:18: field 'lease_protocol': \"http\" is not a protocol lease reads know; "
            "expected \"resp\" (redis's) or \"memcached\" (its text protocol)");
  EXPECT_EQ(GetterError("lease_protocol = 'memcached'\n", "lease_reads"),
            "p.toml:1:18: field 'lease_protocol' names the protocol of lease_reads, but there is "
            "no lease_reads");
  for (const char* bad : {"['get', 'set']", "'GET'", "'gat'", "'get,'", "[]"})
    EXPECT_TRUE(StartsWith(
        GetterError(std::string("lease_protocol = 'memcached'\nlease_reads = ") + bad + "\n",
                    "lease_reads"),
        "p.toml:2:15: field 'lease_reads': "))
        << bad;
  EXPECT_NE(GetterError("lease_protocol = 'memcached'\nlease_reads = 'set'\n", "lease_reads")
                .find("some of get, gets, mg"),
            std::string::npos);
  EXPECT_TRUE(StartsWith(GetterError("lease_protocol = 1\nlease_reads = 'GET'\n", "lease_reads"),
                         "p.toml:1:18: field 'lease_protocol': expected a string"));
  // unknown fields: the nearest known one, else the list of them
  EXPECT_EQ(GetterError("port = 1\nprot = 2\n", "port"),
            "p.toml:2:1: unknown field 'prot' in the top level (did you mean 'port'?)");
  EXPECT_EQ(GetterError("port = 1\nflavour = 'mint'\n", "port"),
            "p.toml:2:1: unknown field 'flavour' in the top level (known fields: port)");
  std::vector<TomlTable> tables;
  std::string error;
  ASSERT_TRUE(
      ParseToml("[[r]]\nid = 0\n\n[r.sub]\nx = 1\n", "p.toml", {"[[r]]"}, false, &tables, &error));
  int64_t id = 0;
  ASSERT_TRUE(tables.at(0).TakeInt("id", &id, true, 0, 6, &error)) << error;
  EXPECT_FALSE(tables[0].NoLeftovers(&error));
  EXPECT_EQ(error, "p.toml:4:1: unknown section [r.sub] (known fields: id)");
  EXPECT_EQ(GetterError("port = 1\n[x]\ny = 1\n", "port"),
            "p.toml:2:1: unknown section [x] (this file has no sections)");
  EXPECT_EQ(GetterError("# nothing\n", "port"), "no fields");  // the caller says what is missing
}

TEST(ParseToml, SectionsComeInFileOrderAndFieldsOutsideThemAreRefused) {
  std::vector<TomlTable> tables;
  std::string error;
  const std::vector<std::string> headers = {"[b]", "[a]", "[[r]]"};
  ASSERT_TRUE(ParseToml("[b]\nx = 1\n[[r]]\nid = 0\n[a]\n[[r]]\nid = 1\n", "p.toml", headers, false,
                        &tables, &error))
      << error;
  std::vector<std::string> order;
  for (const TomlTable& t : tables) order.push_back(t.header + "@" + std::to_string(t.pos.line));
  EXPECT_EQ(order, (std::vector<std::string>{"[b]@1", "[[r]]@3", "[a]@5", "[[r]]@6"}));
  EXPECT_EQ(ParseError("x = 1\n[a]\n", false, headers),
            "p.toml:1:1: field 'x' outside any section (put it under one of [b], [a], [[r]])");
  EXPECT_EQ(ParseError("[[a]]\n", false, headers),
            "p.toml:1:1: unknown section [[a]] (expected [b], [a] or [[r]])");
}

const char kCluster[] = R"([cluster]
secret = "0123456789abcdef0123"

[server]
command = "redis-server --port {port}"
data_template = "/tmp/t"
rendered_files = ["a.conf"]

[[replica]]
id = 0
host = "127.0.0.1"
peer_port = 7401
client_port = 7501
server_port = 7601
dir = "/tmp/x0"
)";

TEST(ClusterConfig, ErrorsNameLineAndColumn) {
  ClusterConfig c;
  std::string error, text = kCluster;
  ASSERT_TRUE(ParseClusterConfig(text, "cluster.toml", &c, &error)) << error;
  EXPECT_EQ(c.server.rendered_files, std::vector<std::string>{"a.conf"});
  std::string bad = text;
  bad.replace(bad.find("7401"), 4, "70000");
  EXPECT_FALSE(ParseClusterConfig(bad, "cluster.toml", &c, &error));
  EXPECT_EQ(error, "cluster.toml:12:13: field 'peer_port': 70000 is out of range 1..65535");
  bad = text;
  bad.replace(bad.find("secret = "), 0, "secert = \"0123456789abcdef0123\"\n");
  EXPECT_FALSE(ParseClusterConfig(bad, "cluster.toml", &c, &error));
  EXPECT_TRUE(StartsWith(error,
                         "cluster.toml:2:1: unknown field 'secert' in [cluster] (did you "
                         "mean 'secret'?)"))
      << error;
  bad = text;
  bad.replace(bad.find("client_port = 7501\n"), 19, "");
  EXPECT_FALSE(ParseClusterConfig(bad, "cluster.toml", &c, &error));
  EXPECT_EQ(error,
            "cluster.toml:9:1: field 'client_port' missing in [[replica]] (add client_port "
            "= ...)");
}

// A lease whose backups' guard would outlast the election timeout's minimum
// is refused where it is written, with the largest that fits; one that fits
// reads back.
TEST(ClusterConfig, LeaseMustFitInTheElectionTimeout) {
  ClusterConfig c;
  std::string error, text = kCluster;
  std::string bad = text;
  bad.replace(bad.find("secret = "), 0, "lease_us = 60000\n");
  EXPECT_FALSE(ParseClusterConfig(bad, "cluster.toml", &c, &error));
  EXPECT_TRUE(StartsWith(error,
                         "cluster.toml:2:12: field 'lease_us': the backups' guard of a 60000 "
                         "us lease (64250 us"))
      << error;
  EXPECT_NE(error.find("a lease of at most about 46588 us"), std::string::npos) << error;
  std::string good = text;
  good.replace(good.find("secret = "), 0, "lease_us = 35000\n");
  ASSERT_TRUE(ParseClusterConfig(good, "cluster.toml", &c, &error)) << error;
  EXPECT_EQ(c.lease_us, 35000u);
  ClusterConfig back;
  ASSERT_TRUE(ParseClusterConfig(FormatClusterConfig(c), "cluster.toml", &back, &error)) << error;
  EXPECT_EQ(back.lease_us, 35000u);
}

// metrics_port: optional (0 or absent: none), in range, and no other port
// of a replica on the same host; FormatClusterConfig writes it back.
TEST(ClusterConfig, MetricsPort) {
  ClusterConfig c;
  std::string error, text = kCluster;
  ASSERT_TRUE(ParseClusterConfig(text, "cluster.toml", &c, &error)) << error;
  EXPECT_EQ(c.replicas[0].metrics_port, 0);
  EXPECT_EQ(FormatClusterConfig(c).find("metrics_port"), std::string::npos);
  std::string with = text + "metrics_port = 7801\n";
  ASSERT_TRUE(ParseClusterConfig(with, "cluster.toml", &c, &error)) << error;
  EXPECT_EQ(c.replicas[0].metrics_port, 7801);
  ClusterConfig back;
  ASSERT_TRUE(ParseClusterConfig(FormatClusterConfig(c), "cluster.toml", &back, &error)) << error;
  EXPECT_EQ(back.replicas[0].metrics_port, 7801);
  ASSERT_TRUE(ParseClusterConfig(text + "metrics_port = 0\n", "cluster.toml", &c, &error));
  EXPECT_EQ(c.replicas[0].metrics_port, 0);
  EXPECT_FALSE(ParseClusterConfig(text + "metrics_port = 70000\n", "cluster.toml", &c, &error));
  EXPECT_EQ(error, "cluster.toml:16:16: field 'metrics_port': 70000 is out of range 0..65535");
  EXPECT_FALSE(ParseClusterConfig(text + "metrics_port = 7601\n", "cluster.toml", &c, &error));
  EXPECT_EQ(error,
            "cluster.toml:16:16: field 'metrics_port': 7601 is also replica 0's server_port on "
            "127.0.0.1 (choose another, or 0 for no metrics listener)");
  EXPECT_FALSE(ParseClusterConfig(text + "metrics_port = \"x\"\n", "cluster.toml", &c, &error));
  EXPECT_NE(error.find("metrics_port"), std::string::npos) << error;
}

// What FormatClusterConfig writes reads back the same, whatever the strings hold.
TEST(ClusterConfig, FormatReadsBack) {
  ClusterConfig c;
  std::string error;
  ASSERT_TRUE(ParseClusterConfig(kCluster, "cluster.toml", &c, &error)) << error;
  c.server.command = "sh -c 'printf \"%s\\n\\t\\r\" \x01\x7f caf\xc3\xa9'";
  c.server.rendered_files = {"a.conf", "with, comma.conf", "sub/\"q\".conf"};
  c.server.unchecked_replies = "INFO, CLIENT LIST";
  c.server.lease_reads = "get, gets, mg";
  c.server.lease_protocol = "memcached";
  std::string text = FormatClusterConfig(c);
  ClusterConfig back;
  ASSERT_TRUE(ParseClusterConfig(text, "cluster.toml", &back, &error)) << error << "\n" << text;
  EXPECT_EQ(back.server.command, c.server.command);
  EXPECT_EQ(back.server.rendered_files, c.server.rendered_files);
  EXPECT_EQ(back.server.unchecked_replies, c.server.unchecked_replies);
  EXPECT_EQ(back.server.lease_reads, c.server.lease_reads);
  EXPECT_EQ(back.server.lease_protocol, "memcached");
  EXPECT_EQ(FormatClusterConfig(back), text);
}

}  // namespace
}  // namespace lockstep
