// json_test.cc — the JSON helpers (json.h), fed what another process might
// send: numbers that are not whole, too large, negative, or missing; text
// that is not JSON; bytes that are not UTF-8, written and read back.
#include "guard/common/json.h"

#include <gtest/gtest.h>

namespace lockstep {
namespace {

Json Parsed(const std::string& text) {
  Json j;
  std::string error;
  EXPECT_TRUE(ParseJson(text, &j, &error)) << error;
  return j;
}

TEST(JsonNumbers, WholeNumbersAreRead) {
  Json j = Parsed(R"({"commit_index":42,"age_s":-3,"big":18446744073709551615})");
  EXPECT_EQ(JsonU64(j, "commit_index"), 42u);
  EXPECT_EQ(JsonI64(j, "age_s"), -3);
  EXPECT_EQ(JsonU64(j, "big"), UINT64_MAX);
  EXPECT_EQ(JsonI64(j, "commit_index"), 42);
}

TEST(JsonNumbers, AnythingElseIsAbsentNeverAThrow) {
  // std::stoull took "12abc" as 12, threw on "abc" and on 2^64: the daemon
  // read a peer's checkpoint index with it, in a thread with no catch.
  Json j = Parsed(R"({"word":"abc","tail":"12abc","huge":18446744073709551616,"neg":-1,)"
                  R"("empty":"","frac":1.5,"list":[1],"null":null})");
  for (const char* key :
       {"word", "tail", "huge", "neg", "empty", "frac", "list", "null", "missing"})
    EXPECT_EQ(JsonU64(j, key, 7), 7u) << key;
  EXPECT_EQ(JsonI64(j, "neg", 7), -1);
  EXPECT_EQ(JsonI64(j, "word", 7), 7);
  EXPECT_EQ(JsonI64(j, "big", 7), 7);
  EXPECT_EQ(JsonDouble(j, "frac"), 1.5);
  EXPECT_EQ(JsonStr(j, "frac", "none"), "none");
  EXPECT_EQ(JsonStr(j, "word"), "abc");
  EXPECT_TRUE(JsonBool(j, "word", true));
  // Not an object at all: every field is absent.
  EXPECT_EQ(JsonU64(Parsed("[1,2]"), "0", 7), 7u);
  EXPECT_TRUE(JsonAt(Parsed("3"), "x").is_null());
}

TEST(JsonParse, NotJsonIsAnErrorThatSaysWhere) {
  for (const char* text : {"", "{", "{\"a\":}", "[1,2", "nul", "{\"a\":1}x", "\"\xff\""}) {
    Json j = 5;
    std::string error;
    EXPECT_FALSE(ParseJson(text, &j, &error)) << text;
    EXPECT_NE(error.find("parse error"), std::string::npos) << error;
    EXPECT_TRUE(j.is_null());
  }
}

TEST(JsonParse, DeepNestingIsRefusedNotAStackOverflow) {
  // dump() and copies recurse: a report file of 60000 nested arrays
  // overflowed the stack (fuzz_json).
  Json j;
  std::string error;
  std::string deep = "{\"a\":" + std::string(60000, '[') + std::string(60000, ']') + "}";
  EXPECT_FALSE(ParseJson(deep, &j, &error));
  EXPECT_NE(error.find("nested deeper than"), std::string::npos) << error;
  std::string ok = std::string(kMaxJsonDepth - 1, '[') + std::string(kMaxJsonDepth - 1, ']');
  EXPECT_TRUE(ParseJson(ok, &j, &error)) << error;
}

TEST(JsonText, TextThatIsNotUtf8IsWrittenNotThrown) {
  // An error text or a path can hold any bytes: dump() would throw on them.
  Json j = {{"error", std::string("bad \xff\xfe byte \x01 \"q\" \\")}, {"n", 3}};
  std::string text = JsonText(j);
  EXPECT_EQ(text, R"({"error":"bad \ufffd\ufffd byte \u0001 \"q\" \\","n":3})");
  EXPECT_EQ(JsonStr(Parsed(text), "error"), "bad \xef\xbf\xbd\xef\xbf\xbd byte \x01 \"q\" \\");
  // Fields stay in the order they were put.
  EXPECT_EQ(JsonText(Json{{"z", 1}, {"a", 2}}), R"({"z":1,"a":2})");
  EXPECT_EQ(JsonText(Json{{"a", 1}}, 2), "{\n  \"a\": 1\n}");
}

TEST(JsonBytes, EveryByteComesBackAsItWas) {
  std::string all;
  for (int c = 0; c < 256; c++) all += static_cast<char>(c);
  Json j = {{"bytes", JsonFromBytes(all)}};
  std::string text = JsonText(j);
  EXPECT_NE(text.find(R"(\u0000\u0001)"), std::string::npos);
  EXPECT_NE(text.find(R"(\u00e9)"), std::string::npos);  // one code point per byte
  EXPECT_EQ(BytesFromJson(JsonStr(Parsed(text), "bytes")), all);
  // Printable ASCII reads as itself.
  EXPECT_EQ(JsonText(Json(JsonFromBytes("GET k\r\n"))), R"("GET k\r\n")");
  // A code point that is not a byte's (not ours) becomes '?'.
  EXPECT_EQ(BytesFromJson("a\xe2\x82\xac"
                          "b"),
            "a?b");
  EXPECT_EQ(BytesFromJson("\xc3"), "?");
}

}  // namespace
}  // namespace lockstep
