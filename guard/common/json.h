// json.h — lockstep's JSON is nlohmann-json's: this header names the type
// every writer builds (insertion-ordered, so that a report or a status reads
// in the order its fields were put) and the few helpers that every reader
// of another process's JSON needs and nlohmann does not give as such:
// parsing that reports an error instead of throwing, field getters that
// answer `absent` for a missing field or one of another type (json::value
// throws then), and text that never throws on bytes that are not UTF-8.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace lockstep {

using Json = nlohmann::ordered_json;

// j as JSON text (compact; indent >= 0: that many spaces a level), ASCII only (the rest as \uXXXX):
// strings that are not valid UTF-8 (an error text, a path) have each bad byte replaced by U+FFFD
// rather than throwing. Byte strings that must survive exactly go in as JsonFromBytes.
std::string JsonText(const Json& j, int indent = -1);

// Text from another process or from disk, parsed: false (and *error says
// where and why) when it is not JSON, or nests deeper than kMaxJsonDepth
// arrays and objects. Never throws.
constexpr int kMaxJsonDepth = 32;
bool ParseJson(std::string_view text, Json* out, std::string* error);

// Fields of an object; `absent` when j is not an object, the field is
// missing, or it is not of the type asked (a number that is not whole, or
// out of range, is not a whole number). Never throws.
uint64_t JsonU64(const Json& j, const char* key, uint64_t absent = 0);
int64_t JsonI64(const Json& j, const char* key, int64_t absent = 0);
double JsonDouble(const Json& j, const char* key, double absent = 0);
bool JsonBool(const Json& j, const char* key, bool absent = false);
std::string JsonStr(const Json& j, const char* key, const std::string& absent = "");
// The field itself; a null value when j is not an object or has no such field.
const Json& JsonAt(const Json& j, const char* key);

// Raw bytes (a server's output, a client's input) as a JSON string whose
// code points are the bytes, U+0000..U+00FF: printable ASCII reads as
// itself and any parser takes the rest (JsonText writes it \u00XX).
std::string JsonFromBytes(std::string_view bytes);
// Back to the bytes; a code point above U+00FF (not ours) becomes '?'.
std::string BytesFromJson(const std::string& utf8);

}  // namespace lockstep
