#include "runtime/proto_json.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"

namespace lspo::runtime {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::ordered_json;

// "MODE" for an enum whose value 0 is MODE_UNSPECIFIED; "" when it follows no prefix.
std::string EnumPrefix(const EnumDescriptor& type) {
  const EnumValueDescriptor* zero = type.FindValueByNumber(0);
  if (zero == nullptr || !absl::EndsWith(zero->name(), "_UNSPECIFIED")) return "";
  return zero->name().substr(0, zero->name().size() - std::string("_UNSPECIFIED").size());
}

// Whether every value of `type` is PREFIX_SHORT.
bool HasShortNames(const EnumDescriptor& type) {
  const std::string prefix = EnumPrefix(type);
  if (prefix.empty()) return false;
  for (int k = 0; k < type.value_count(); ++k) {
    if (!absl::StartsWith(type.value(k)->name(), prefix + "_")) return false;
  }
  return true;
}

// Rewrites the enum values in `j` (the JSON of a `d`) to full names (to_full) or short names.
// Errors: kInvalidArgument for a string that names no value of its closed set.
absl::Status RewriteEnums(const Descriptor& d, Json* j, bool to_full, const std::string& where,
                          absl::string_view source) {
  if (!j->is_object()) return absl::OkStatus();
  for (auto& [key, value] : j->items()) {
    const FieldDescriptor* f = FindJsonField(d, key);
    if (f == nullptr || f->is_map()) continue;
    const std::string path = where.empty() ? f->name() : absl::StrCat(where, ".", f->name());
    std::vector<Json*> items;
    if (f->is_repeated() && value.is_array()) {
      for (auto& v : value) items.push_back(&v);
    } else {
      items.push_back(&value);
    }
    for (Json* v : items) {
      if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
        absl::Status st = RewriteEnums(*f->message_type(), v, to_full, path, source);
        if (!st.ok()) return st;
        continue;
      }
      if (f->type() != FieldDescriptor::TYPE_ENUM || !v->is_string()) continue;
      const EnumDescriptor& type = *f->enum_type();
      if (!HasShortNames(type)) continue;
      const std::string s = v->get<std::string>();
      const EnumValueDescriptor* e = FindEnumValue(type, s);
      if (e == nullptr) {
        std::vector<std::string> names;
        for (int k = 1; k < type.value_count(); ++k) names.push_back(EnumShortName(*type.value(k)));
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": field ", path, " = '", s, "' is not one of ",
                         absl::StrJoin(names, ", "), " (or leave it empty)"));
      }
      *v = to_full ? e->name() : EnumShortName(*e);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string EnumShortName(const EnumValueDescriptor& value) {
  const EnumDescriptor& type = *value.type();
  if (!HasShortNames(type)) return value.name();
  if (value.number() == 0) return "";
  const std::string rest = value.name().substr(EnumPrefix(type).size() + 1);
  return absl::StrReplaceAll(absl::AsciiStrToLower(rest), {{"_", "-"}});
}

const EnumValueDescriptor* FindEnumValue(const EnumDescriptor& type, absl::string_view name) {
  if (const EnumValueDescriptor* e = type.FindValueByName(std::string(name))) return e;
  if (!HasShortNames(type)) return nullptr;
  if (name.empty()) return type.FindValueByNumber(0);
  const std::string full = absl::StrCat(
      EnumPrefix(type), "_", absl::StrReplaceAll(absl::AsciiStrToUpper(name), {{"-", "_"}}));
  const EnumValueDescriptor* e = type.FindValueByName(full);
  return e != nullptr && e->number() != 0 ? e : nullptr;
}

std::string ProtoToJson(const google::protobuf::Message& message, ProtoJsonPrint print) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = print.print_defaults;
  if (!google::protobuf::util::MessageToJsonString(message, &text, o).ok()) return text;
  try {
    Json j = Json::parse(text);
    (void)RewriteEnums(*message.GetDescriptor(), &j, /*to_full=*/false, "", "");
    return print.pretty ? j.dump(2) : j.dump();
  } catch (const nlohmann::json::exception&) {
    return text;  // Not reached for protobuf's own output; never throws to the caller.
  }
}

absl::Status ProtoFromJson(absl::string_view json, google::protobuf::Message* message,
                           absl::string_view source, bool ignore_unknown_fields) {
  message->Clear();
  Json j;
  try {
    j = Json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, " is not valid JSON: ", e.what()));
  }
  absl::Status st = RewriteEnums(*message->GetDescriptor(), &j, /*to_full=*/true, "", source);
  if (!st.ok()) return st;
  std::string text;
  try {
    text = j.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " holds text that is not valid UTF-8: save the file as UTF-8"));
  }
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = ignore_unknown_fields;
  auto parsed = google::protobuf::util::JsonStringToMessage(text, message, o);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", parsed.ToString()));
  }
  return absl::OkStatus();
}

std::string ProtoDifferences(const google::protobuf::Message& a, const google::protobuf::Message& b,
                             size_t max_chars) {
  std::string report;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&report);
  if (d.Compare(a, b)) return "";
  while (!report.empty() && report.back() == '\n') report.pop_back();
  absl::StrReplaceAll({{"\n", "; "}}, &report);
  if (report.size() > max_chars) report = report.substr(0, max_chars) + "...";
  return report;
}

const FieldDescriptor* FindJsonField(const Descriptor& d, const std::string& key) {
  const FieldDescriptor* f = d.FindFieldByName(key);
  return f != nullptr ? f : d.FindFieldByCamelcaseName(key);
}

}  // namespace lspo::runtime
