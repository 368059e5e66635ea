// JSON for protobuf messages: protobuf's JSON mapping (google::protobuf::util) with the
// project's conventions, in one place for the job spec parser, the job store, the run log
// and lspctl.
//
// Conventions:
// - Field names are the proto names (snake_case), as in the YAML/JSON job specs.
// - A closed set is a proto enum whose values are named PREFIX_SHORT, PREFIX being the name
//   of value 0 without "_UNSPECIFIED" (MODE_UNSPECIFIED, MODE_LSP, MODE_ZERO). Such values are
//   written by their short names, lower case with '_' as '-' ("lsp", "tiny-random"; value 0
//   is ""), and read by the short name (any case, '-' or '_') or the full name, so specs keep
//   the strings they always had. Enums not following the pattern (JobState, DType) keep their
//   full names both ways.
//
// Thread-safety: stateless functions.
#ifndef LSPO_RUNTIME_PROTO_JSON_H_
#define LSPO_RUNTIME_PROTO_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"
#include "google/protobuf/message.h"

namespace lspo::runtime {

// How ProtoToJson prints.
struct ProtoJsonPrint {
  bool pretty = false;          // Indented, one field per line.
  bool print_defaults = false;  // Also fields at their default (0, "", false, value 0).

  static ProtoJsonPrint Pretty() { return {true, false}; }
  static ProtoJsonPrint WithDefaults() { return {false, true}; }
};

// `message` as JSON text (see the file comment for names and enums). Never fails for the
// project's messages (no Any / unknown well-known types); should protobuf's printer fail, its
// text is returned as it is (enums then by full name).
std::string ProtoToJson(const google::protobuf::Message& message, ProtoJsonPrint print = {});

// Parses `json` into `message` (cleared first), accepting short enum names. `source` names the
// input in messages ("job spec 'a.yaml'"). Errors: kInvalidArgument naming the source and
// the field: malformed JSON, an unknown field (unless ignore_unknown_fields), a wrong type,
// or a closed-set value outside the set (listing the accepted values).
absl::Status ProtoFromJson(absl::string_view json, google::protobuf::Message* message,
                           absl::string_view source, bool ignore_unknown_fields = false);

// The fields in which two messages of one type differ, one per line of protobuf's
// MessageDifferencer report ("modified: lsp.d: 64 -> 128", "added: seed: 7"), cut to
// `max_chars` (then "..."); "" when they are equal. For errors that say what differs between
// two job specs (resume, the ranks of a data-parallel job).
std::string ProtoDifferences(const google::protobuf::Message& a, const google::protobuf::Message& b,
                             size_t max_chars = 2000);

// The short name of `value` ("lsp" for MODE_LSP; "" for value 0), or its full name when its
// enum does not follow the PREFIX_SHORT pattern.
std::string EnumShortName(const google::protobuf::EnumValueDescriptor& value);

// The short name of a generated enum's value (EnumShortName(v1::STEP_SCHEDULE_OVERLAP) ==
// "overlap"); the number as text for a value outside the enum.
template <typename E>
std::string EnumShortName(E value) {
  const google::protobuf::EnumValueDescriptor* v =
      google::protobuf::GetEnumDescriptor<E>()->FindValueByNumber(static_cast<int>(value));
  return v != nullptr ? EnumShortName(*v) : absl::StrCat(static_cast<int>(value));
}

// The value of enum `type` named `name` (short or full, see the file comment); null if none.
const google::protobuf::EnumValueDescriptor* FindEnumValue(
    const google::protobuf::EnumDescriptor& type, absl::string_view name);

// The field of message type `d` a JSON key names: its proto name ("grad_accum") or its
// lowerCamelCase JSON name ("gradAccum"), as ProtoFromJson accepts both; null if neither.
const google::protobuf::FieldDescriptor* FindJsonField(const google::protobuf::Descriptor& d,
                                                       const std::string& key);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_PROTO_JSON_H_
