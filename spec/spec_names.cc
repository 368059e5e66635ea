#include "spec/spec_names.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "proto/job_spec.pb.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace lspo::spec {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using Json = nlohmann::json;

// Sources: transformers TrainingArguments (v4.46 field names), TRL SFTConfig (max_seq_length,
// later max_length), PEFT LoraConfig (r, lora_alpha, target_modules, as flat lora_* names in
// Axolotl) and Axolotl's config reference (base_model, sequence_len, num_epochs, lr_scheduler,
// micro_batch_size is already ours).
constexpr SpecAlias kAliases[] = {
    {"model_name_or_path", "model.path", "transformers"},
    {"base_model", "model.path", "Axolotl"},
    {"learning_rate", "optim.lr", "transformers"},
    {"weight_decay", "optim.weight_decay", "transformers"},
    {"max_grad_norm", "optim.max_grad_norm", "transformers"},
    {"adam_beta1", "optim.beta1", "transformers"},
    {"adam_beta2", "optim.beta2", "transformers"},
    {"adam_epsilon", "optim.eps", "transformers"},
    {"warmup_steps", "optim.warmup_steps", "transformers"},
    {"lr_scheduler_type", "optim.schedule", "transformers"},
    {"lr_scheduler", "optim.schedule", "Axolotl"},
    {"max_steps", "steps", "transformers"},
    {"num_train_epochs", "epochs", "transformers"},
    {"num_epochs", "epochs", "Axolotl"},
    {"warmup_ratio", "optim.warmup_ratio", "transformers"},
    {"per_device_train_batch_size", "micro_batch_size", "transformers"},
    {"gradient_accumulation_steps", "grad_accum", "transformers"},
    {"max_seq_length", "seq_len", "TRL"},
    {"max_length", "seq_len", "TRL"},
    {"sequence_len", "seq_len", "Axolotl"},
    {"gradient_checkpointing", "activation_checkpointing", "transformers"},
    {"eval_steps", "eval_every", "transformers"},
    {"save_steps", "checkpoint_every", "transformers"},
    {"save_total_limit", "keep_checkpoints", "transformers"},
    {"lora_r", "lora.r", "Axolotl"},
    {"lora_alpha", "lora.alpha", "Axolotl"},
    {"lora_target_modules", "lora.target_modules", "Axolotl"},
    {"packing", "data.packing", "TRL"},
    // This project's clearer spellings of its own fields, whose first names read as something
    // else (lsp.alpha is no LoRA alpha) or say GB / MB for GiB / MiB; the old names still work.
    {"lsp.refit_threshold", "lsp.alpha", "this project"},
    {"lsp.calibration_memory_mib", "lsp.calibration_memory_mb", "this project"},
    {"device_memory_limit_mib", "device_memory_limit_mb", "this project"},
};

const SpecAlias* FindAlias(absl::string_view key) {
  for (const SpecAlias& a : kAliases) {
    if (a.alias == key) return &a;
  }
  return nullptr;
}

// Keys of transformers' TrainingArguments, TRL's SFTConfig, PEFT's LoraConfig and Axolotl that
// are no JobSpec field: what a spec with one of them gets.
struct ForeignKey {
  absl::string_view key;
  // Empty: the key is dropped with a warning (`advice` says why nothing is lost). Else the
  // field the key sets, through `Translate` below (bf16: true -> weight_dtype: bf16).
  absl::string_view field;
  absl::string_view advice;
};

constexpr ForeignKey kForeignKeys[] = {
    {"bf16", "weight_dtype",
     "bf16: true is weight_dtype: bf16 (16-bit weights on the worker, fp32 master weights and "
     "Adam state on the host), false is weight_dtype: fp32"},
    {"fp16", "", "fp16 weights are not offered; use bf16: true (weight_dtype: bf16)"},
    {"tf32", "", "a CUDA worker already runs fp32 matmuls on TF32 tensor cores"},
    {"lora_dropout", "", "this product's LoRA has no dropout: remove the key or set it to 0"},
    {"optim", "", ""},  // TrainingArguments' optimizer name; see OptimName below.
    {"logging_steps", "", "every step is logged (metrics.jsonl, TensorBoard)"},
    {"logging_strategy", "", "every step is logged (metrics.jsonl, TensorBoard)"},
    {"logging_first_step", "", "every step is logged (metrics.jsonl, TensorBoard)"},
    {"logging_dir", "", "TensorBoard event files go to output_dir/runs"},
    {"report_to", "", "TensorBoard event files are always written (output_dir/runs)"},
    {"run_name", "", "the job is named by its id (lspctl submit --job_id) and output_dir"},
    {"eval_strategy", "", "evaluation runs every eval_every (eval_steps) steps"},
    {"evaluation_strategy", "", "evaluation runs every eval_every (eval_steps) steps"},
    {"save_strategy", "", "checkpoints are written every checkpoint_every (save_steps) steps"},
    {"per_device_eval_batch_size", "", "evaluation batches are sized by the worker"},
    {"dataloader_num_workers", "", "the worker tokenises the data once, at load"},
    {"dataloader_pin_memory", "", "a CUDA worker pins its staging buffers itself"},
    {"remove_unused_columns", "", "the data loader reads only the keys it knows"},
    {"overwrite_output_dir", "",
     "output_dir is never overwritten: a fresh start next to earlier checkpoints is refused"},
    {"do_train", "", "a job always trains"},
    {"do_eval", "", "evaluation follows data.eval_path and eval_every"},
    {"save_safetensors", "", "models and checkpoints are always safetensors"},
    {"push_to_hub", "", "nothing is uploaded; the output folder is a Hugging Face model folder"},
    {"dataset_text_field", "",
     "text records are read from the key \"text\" (docs/spec.md lists the record shapes)"},
};

const ForeignKey* FindForeignKey(absl::string_view key) {
  for (const ForeignKey& k : kForeignKeys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

// transformers' `optim` values that name the AdamW every mode here runs (decoupled weight
// decay, Loshchilov & Hutter 2019); anything else is another optimizer.
bool IsAdamWName(absl::string_view name) {
  return name == "adamw_torch" || name == "adamw_torch_fused" || name == "adamw_hf" ||
         name == "adamw" || name == "adamw_apex_fused";
}

// The key under which `obj` holds field `f` (its proto or JSON name), or "" when it does not.
std::string KeyOf(const Json& obj, const FieldDescriptor& f) {
  if (obj.contains(f.name())) return f.name();
  if (obj.contains(f.json_name())) return f.json_name();
  return "";
}

// Levenshtein distance (insertions, deletions, substitutions, each 1).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Up to three names of `candidates` nearest to `key`: within a third of its length (at least
// 2 edits), or holding it / held by it as a word ("lr" in "min_lr_ratio"), nearest first.
std::vector<std::string> Nearest(const std::string& key,
                                 const std::vector<std::string>& candidates) {
  std::vector<std::pair<size_t, std::string>> scored;
  // A key far longer than any field name (hostile or pasted text) is near none of them; not
  // scoring it keeps the check linear in the spec's size.
  if (key.size() > 64) return {};
  const std::string lower = absl::AsciiStrToLower(key);
  const size_t limit = std::max<size_t>(2, lower.size() / 3);
  for (const std::string& c : candidates) {
    // A nested field ("lora.r") is scored by its own name.
    const size_t dot = c.rfind('.');
    const std::string leaf = dot == std::string::npos ? c : c.substr(dot + 1);
    const size_t d = EditDistance(lower, leaf);
    const bool contains = lower.size() >= 3 && (leaf.find(lower) != std::string::npos ||
                                                lower.find(leaf) != std::string::npos);
    if (d <= limit || contains) scored.emplace_back(d, c);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < 3; ++i) {
    if (std::find(out.begin(), out.end(), scored[i].second) == out.end()) {
      out.push_back(scored[i].second);
    }
  }
  return out;
}

// The field names of `d` ("lr", "beta1", ...) and, at the top level, the aliases and the
// fields of the top-level messages ("lora.r", "optim.lr": a key written one level too high).
std::vector<std::string> NamesOf(const Descriptor& d, bool top) {
  std::vector<std::string> names;
  for (int i = 0; i < d.field_count(); ++i) names.push_back(d.field(i)->name());
  if (top) {
    for (const SpecAlias& a : kAliases) names.emplace_back(a.alias);
    for (int i = 0; i < d.field_count(); ++i) {
      const FieldDescriptor& f = *d.field(i);
      if (f.type() != FieldDescriptor::TYPE_MESSAGE || f.is_repeated()) continue;
      for (int k = 0; k < f.message_type()->field_count(); ++k) {
        names.push_back(absl::StrCat(f.name(), ".", f.message_type()->field(k)->name()));
      }
    }
  }
  return names;
}

// Appends to `unknown` every key of `j` (the JSON of a `d` at dotted path `where`) that names
// no field, with its suggestions, recursing into message fields.
void CollectUnknown(const Descriptor& d, const Json& j, const std::string& where,
                    std::vector<std::string>* unknown) {
  if (!j.is_object()) return;
  for (const auto& [key, value] : j.items()) {
    const FieldDescriptor* f = runtime::FindJsonField(d, key);
    const std::string path = where.empty() ? key : absl::StrCat(where, ".", key);
    if (f == nullptr) {
      const std::vector<std::string> near = Nearest(key, NamesOf(d, where.empty()));
      std::string line =
          absl::StrCat("'", path.size() > 80 ? absl::StrCat(path.substr(0, 80), "...") : path, "'");
      if (!near.empty()) {
        absl::StrAppend(&line, " (did you mean ",
                        absl::StrJoin(near, " or ",
                                      [&](std::string* out, const std::string& n) {
                                        absl::StrAppend(out, where.empty() ? "" : where,
                                                        where.empty() ? "" : ".", n);
                                      }),
                        "?)");
      }
      unknown->push_back(std::move(line));
      continue;
    }
    if (f->type() != FieldDescriptor::TYPE_MESSAGE || f->is_map()) continue;
    if (f->is_repeated() && value.is_array()) {
      for (const Json& item : value) CollectUnknown(*f->message_type(), item, path, unknown);
    } else {
      CollectUnknown(*f->message_type(), value, path, unknown);
    }
  }
}

// The value lr_scheduler_type / lr_scheduler carry in transformers' spelling, in ours.
Json ScheduleValue(const Json& v) {
  if (!v.is_string()) return v;
  const std::string s = absl::AsciiStrToLower(v.get<std::string>());
  if (s == "constant_with_warmup") return "constant";  // Our warm-up precedes every schedule.
  if (s == "cosine_with_min_lr") return "cosine";      // optim.min_lr_ratio sets the floor.
  return v;
}

// Sets the field at dotted `path` (proto or JSON names; top-level aliases resolved) of `root`
// to `value`, creating the messages on the way and replacing the key the field had under
// either of its names. `raw` (may be null): the value as typed on the command line, taken
// as is by a string field (name=007 stays "007", not the number 7).
// Errors: kInvalidArgument naming `what` for a path that names no field (with suggestions)
// or goes through a field that is not a message.
absl::Status SetPath(const std::string& path, Json value, absl::string_view what, Json* root,
                     const std::string* raw = nullptr) {
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  if (const SpecAlias* a = FindAlias(path); a != nullptr) {  // learning_rate, lsp.refit_threshold
    parts = absl::StrSplit(a->field, '.');
    if (a->field == "optim.schedule") value = ScheduleValue(value);
  }
  const Descriptor* d = lspo::v1::JobSpec::descriptor();
  Json* node = root;
  std::string where;
  for (size_t k = 0; k < parts.size(); ++k) {
    const FieldDescriptor* f = runtime::FindJsonField(*d, parts[k]);
    if (f == nullptr) {
      const std::vector<std::string> near = Nearest(parts[k], NamesOf(*d, where.empty()));
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", path, "' names no field", where.empty() ? "" : " of ", where,
          near.empty() ? "" : absl::StrCat(" (did you mean ", absl::StrJoin(near, " or "), "?)"),
          "; see proto/job_spec.proto (message JobSpec) and docs/spec.md"));
    }
    std::string key = KeyOf(*node, *f);
    if (key.empty()) key = f->name();
    where = where.empty() ? f->name() : absl::StrCat(where, ".", f->name());
    if (k + 1 == parts.size()) {
      if (raw != nullptr && f->type() == FieldDescriptor::TYPE_STRING && !f->is_repeated() &&
          !value.is_string() && !value.is_null()) {
        value = *raw;
      }
      (*node)[key] = std::move(value);
      return absl::OkStatus();
    }
    if (f->type() != FieldDescriptor::TYPE_MESSAGE || f->is_repeated() || f->is_map()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", path, "': ", where, " holds a value, not fields; write ", where, "=VALUE"));
    }
    Json& next = (*node)[key];
    if (next.is_null()) next = Json::object();
    if (!next.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": '", path, "': the spec's ", where, " is not a mapping"));
    }
    node = &next;
    d = f->message_type();
  }
  return absl::OkStatus();
}

// The value of dotted `field` in `root` (proto or JSON names), or null when unset.
const Json* GetPath(const Json& root, absl::string_view field) {
  const Descriptor* d = lspo::v1::JobSpec::descriptor();
  const Json* node = &root;
  for (absl::string_view part : absl::StrSplit(field, '.')) {
    if (!node->is_object()) return nullptr;
    const FieldDescriptor* f = runtime::FindJsonField(*d, std::string(part));
    if (f == nullptr) return nullptr;
    const std::string key = KeyOf(*node, *f);
    if (key.empty()) return nullptr;
    node = &node->at(key);
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) d = f->message_type();
  }
  return node;
}

// Step 1 of NormalizeSpecJson: the aliases of `root`'s top level become their fields. Each
// disagreement (an alias and its field, or two aliases of one field) is appended to `errors`.
void ResolveAliases(Json* root, std::vector<std::string>* errors) {
  for (const SpecAlias& a : kAliases) {
    // A dotted alias (lsp.refit_threshold) is a key of its parent mapping (lsp:).
    Json* parent = root;
    absl::string_view key = a.alias;
    if (const size_t dot = key.rfind('.'); dot != absl::string_view::npos) {
      auto p = root->find(std::string(key.substr(0, dot)));
      if (p == root->end() || !p->is_object()) continue;
      parent = &*p;
      key = key.substr(dot + 1);
    }
    auto it = parent->find(std::string(key));
    if (it == parent->end()) continue;
    Json value = *it;
    parent->erase(it);
    if (a.field == "steps" && value.is_number() && value.get<double>() < 0) continue;
    if (a.field == "optim.schedule") value = ScheduleValue(value);
    // Two aliases of one field (max_length and max_seq_length) or an alias beside its field.
    if (const Json* had = GetPath(*root, a.field); had != nullptr && !had->is_null()) {
      if (*had != value) {
        errors->push_back(absl::StrCat(a.alias, " (the ", a.where, " name of ", a.field, ") is ",
                                       value.dump(), " but ", a.field, " is ", had->dump(),
                                       " (set by the spec or another alias); keep one of them"));
      }
      continue;
    }
    absl::Status st = SetPath(std::string(a.field), std::move(value), a.alias, root);
    if (!st.ok()) errors->push_back(std::string(st.message()));
  }
}

// Step 0 of NormalizeSpecJson: the top-level keys of kForeignKeys. Each is translated into its
// field (bf16), dropped with a warning naming `source` (what the product does anyway), or
// refused (appended to `errors`) when dropping it would change what the user asked for.
void ResolveForeignKeys(absl::string_view source, Json* root, std::vector<std::string>* errors) {
  std::vector<std::string> keys;
  for (const auto& item : root->items()) {
    if (FindForeignKey(item.key()) != nullptr) keys.push_back(item.key());
  }
  for (const std::string& key : keys) {
    const ForeignKey& fk = *FindForeignKey(key);
    const Json value = root->at(key);
    auto refuse = [&](absl::string_view why) {
      errors->push_back(absl::StrCat(key, ": ", value.dump(), ": ", why));
    };
    if (key == "optim") {
      if (value.is_object()) continue;  // Our optim block.
      if (!value.is_string() || !IsAdamWName(absl::AsciiStrToLower(value.get<std::string>()))) {
        refuse(
            "optim here is the block of AdamW settings (optim.lr, optim.weight_decay, ...), "
            "not an optimizer's name: every mode runs AdamW (transformers' adamw_torch); "
            "remove the line");
        continue;
      }
      LOG(WARNING) << "job spec " << source << ": optim: " << value.dump()
                   << " ignored: every mode runs AdamW";
      root->erase(key);
      continue;
    }
    const bool falsy = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                       (value.is_number() && value.get<double>() == 0);
    if (key == "bf16") {
      if (!value.is_boolean()) {
        refuse("write true or false");
        continue;
      }
      root->erase(key);
      const Json dtype = value.get<bool>() ? "bf16" : "fp32";
      if (const Json* had = GetPath(*root, fk.field); had != nullptr && !had->is_null()) {
        const google::protobuf::EnumValueDescriptor* v =
            had->is_string() ? runtime::FindEnumValue(*lspo::v1::WeightDtype_descriptor(),
                                                      had->get<std::string>())
                             : nullptr;
        const int want =
            value.get<bool>() ? lspo::v1::WEIGHT_DTYPE_BF16 : lspo::v1::WEIGHT_DTYPE_FP32;
        if (v == nullptr || v->number() != want) {
          refuse(absl::StrCat("it means weight_dtype: ", dtype.get<std::string>(),
                              " but the spec sets weight_dtype: ", had->dump(), "; keep one"));
        }
        continue;
      }
      (*root)["weight_dtype"] = dtype;
      continue;
    }
    if (key == "fp16" || key == "lora_dropout") {
      if (!falsy) {
        refuse(fk.advice);
        continue;
      }
    } else if (key == "dataset_text_field") {
      if (value != Json("text")) {
        refuse(
            "text records are read from the key \"text\": rename the field in the data, or "
            "use another record shape (docs/spec.md)");
        continue;
      }
    }
    LOG(WARNING) << "job spec " << source << ": " << key << " ignored: " << fk.advice;
    root->erase(key);
  }
}

// Makes scalars fit their fields, recursively over `j` (the JSON of a `d`): a number or
// boolean in a string field becomes its text (name: 123), and a string in a list-of-strings
// field becomes the list of its comma-separated items (target_modules: q_proj,v_proj).
void CoerceScalars(const Descriptor& d, Json* j) {
  if (!j->is_object()) return;
  for (auto& [key, value] : j->items()) {
    const FieldDescriptor* f = runtime::FindJsonField(d, key);
    if (f == nullptr || f->is_map()) continue;
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated() && value.is_array()) {
        for (Json& item : value) CoerceScalars(*f->message_type(), &item);
      } else {
        CoerceScalars(*f->message_type(), &value);
      }
      continue;
    }
    if (f->type() != FieldDescriptor::TYPE_STRING) continue;
    if (!f->is_repeated() && (value.is_number() || value.is_boolean())) {
      value = value.dump();
    } else if (f->is_repeated() && value.is_string()) {
      Json items = Json::array();
      for (absl::string_view part : absl::StrSplit(value.get<std::string>(), ',')) {
        part = absl::StripAsciiWhitespace(part);
        if (!part.empty()) items.push_back(std::string(part));
      }
      value = std::move(items);
    }
  }
}

// Step 2 of NormalizeSpecJson: override `o` ("key=value") applied to `root`; `seen` holds the
// fields earlier overrides set. Errors: as NormalizeSpecJson's for an override.
absl::Status ApplyOverride(const std::string& o, absl::string_view source,
                           std::vector<std::string>* seen, Json* root) {
  const size_t eq = o.find('=');
  const std::string what = absl::StrCat("override '", o, "'");
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not key=value (e.g. optim.lr=3e-4 or learning_rate=3e-4)"));
  }
  if (eq + 1 == o.size()) {
    // YAML reads an empty value as null, which protobuf reads as the field's default: the
    // spec's value would be dropped without a word.
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has no value; write ", o, "VALUE (an empty string: ", o, "'')"));
  }
  const std::string key = o.substr(0, eq);
  const std::string raw = o.substr(eq + 1);
  const SpecAlias* alias = FindAlias(key);
  const std::string field = alias != nullptr ? std::string(alias->field) : key;
  if (std::find(seen->begin(), seen->end(), field) != seen->end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", field, " is set by an earlier override too; keep one"));
  }
  seen->push_back(field);
  Json value;
  try {
    value = YamlToJson(YAML::Load(raw));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the value is not valid YAML: ", e.what()));
  }
  if (field == "steps" && alias != nullptr && value.is_number() && value.get<double>() < 0) {
    root->erase("steps");  // transformers' max_steps = -1: the epochs decide.
    return absl::OkStatus();
  }
  // A length given on the command line replaces the spec's, in steps or in epochs.
  if (field == "steps") root->erase("epochs");
  if (field == "epochs") root->erase("steps");
  if (FindForeignKey(key) != nullptr) {
    Json one = Json::object();
    one[key] = std::move(value);
    std::vector<std::string> errors;
    ResolveForeignKeys(source, &one, &errors);
    if (!errors.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", absl::StrJoin(errors, "; ")));
    }
    for (auto& [k, v] : one.items()) RETURN_IF_ERROR(SetPath(k, v, what, root));
    return absl::OkStatus();
  }
  return SetPath(key, std::move(value), what, root, &raw);
}

}  // namespace

Json YamlToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json obj = Json::object();
      for (const auto& kv : node) {
        const std::string key = kv.first.as<std::string>();
        if (obj.contains(key)) {
          throw YAML::ParserException(
              kv.first.Mark(), absl::StrCat("the key '", key.size() > 80 ? key.substr(0, 80) : key,
                                            "' appears twice in one mapping; keep one"));
        }
        obj[key] = YamlToJson(kv.second);
      }
      return obj;
    }
    case YAML::NodeType::Sequence: {
      Json arr = Json::array();
      for (const auto& item : node) arr.push_back(YamlToJson(item));
      return arr;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = node.Scalar();
      if (node.Tag() == "!") return s;  // Quoted scalar: keep as a string.
      int64_t i;
      double d;
      if (absl::SimpleAtoi(s, &i)) return i;
      if (absl::SimpleAtod(s, &d) && s.find_first_of("0123456789") != std::string::npos) {
        if (!std::isfinite(d)) {
          throw YAML::ParserException(node.Mark(),
                                      absl::StrCat("the number ", s,
                                                   " is outside the range of a double "
                                                   "(about 1.8e308); write a finite number"));
        }
        return d;
      }
      const std::string lower = absl::AsciiStrToLower(s);
      if (lower == "true") return true;
      if (lower == "false") return false;
      return s;
    }
    default:
      return nullptr;
  }
}

absl::Span<const SpecAlias> SpecAliases() { return kAliases; }

absl::Status NormalizeSpecJson(const std::vector<std::string>& overrides, absl::string_view source,
                               Json* root) {
  if (!root->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec ", source, ": expected a mapping (an object) at the top level"));
  }
  std::vector<std::string> errors;
  ResolveForeignKeys(source, root, &errors);
  ResolveAliases(root, &errors);
  std::vector<std::string> seen;
  for (const std::string& o : overrides) {
    absl::Status st = ApplyOverride(o, source, &seen, root);
    if (!st.ok()) errors.push_back(std::string(st.message()));
  }
  CoerceScalars(*lspo::v1::JobSpec::descriptor(), root);
  std::vector<std::string> unknown;
  CollectUnknown(*lspo::v1::JobSpec::descriptor(), *root, "", &unknown);
  if (errors.empty() && unknown.empty()) return absl::OkStatus();
  std::string message = absl::StrCat("job spec ", source, ": ");
  if (!errors.empty()) {
    if (errors.size() > 20) errors.resize(20);
    absl::StrAppend(&message, absl::StrJoin(errors, "; "), unknown.empty() ? "" : "; ");
  }
  if (!unknown.empty()) {
    const size_t n = unknown.size();
    if (n > 20) {
      unknown.resize(20);
      unknown.push_back(absl::StrCat("and ", n - 20, " more"));
    }
    absl::StrAppend(&message, n, " unknown field", n == 1 ? "" : "s", ": ",
                    absl::StrJoin(unknown, ", "),
                    ". See proto/job_spec.proto (message JobSpec) for the fields and docs/spec.md "
                    "for the transformers / TRL / Axolotl names accepted");
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace lspo::spec
