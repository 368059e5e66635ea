// The names people already type for a job's settings (issue 45): the Hugging Face Trainer's
// (transformers TrainingArguments), TRL's (SFTConfig) and Axolotl's names for the same
// settings, accepted as aliases of JobSpec fields; `key=value` overrides of any field from the
// command line; and every unknown key of a spec reported at once, each with the nearest valid
// names. Works on the spec as a JSON tree, before protobuf's JSON mapping reads it
// (spec/job_spec.h ParseJobSpecJson / ParseJobSpecYaml / LoadJobSpecFile call it).
//
// Thread-safety: stateless functions over the caller's tree.
#ifndef LSPO_SPEC_SPEC_NAMES_H_
#define LSPO_SPEC_SPEC_NAMES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace YAML {
class Node;
}  // namespace YAML

namespace lspo::spec {

// A YAML node as JSON: mappings as objects, sequences as arrays, scalars that read as integers,
// finite numbers or booleans (true / false, any case) as such, quoted scalars and the rest as
// strings, null as null. Throws YAML::ParserException for a number outside the double range
// (JSON cannot hold +-inf; it would become null, the field's default, silently) and for a key
// that appears twice in one mapping (one of the two values would be lost without a word).
nlohmann::json YamlToJson(const YAML::Node& node);

// One alias: a top-level key `alias` of a spec means the JobSpec field at dotted path
// `field` (proto names, "optim.lr").
struct SpecAlias {
  absl::string_view alias;  // "learning_rate"
  absl::string_view field;  // "optim.lr"
  absl::string_view where;  // Whose name it is: "transformers", "TRL", "Axolotl", or "this
                            // project" (a clearer spelling of its own field, e.g.
                            // lsp.refit_threshold for lsp.alpha; dotted aliases live in their
                            // parent mapping).
};

// Every alias, in the order docs/spec.md lists them (sources: transformers
// TrainingArguments, TRL SFTConfig and PEFT LoraConfig field names; Axolotl's config
// reference).
absl::Span<const SpecAlias> SpecAliases();

// Rewrites `root`, a job spec as a JSON object (keys as written in the file: proto names or
// their lowerCamelCase JSON names), so that protobuf's JSON mapping reads it:
//  0. keys of those tools that are no field here (ForeignKeys: bf16, logging_steps, optim:
//     adamw_torch, ...) are translated (bf16: true -> weight_dtype: bf16), dropped with a
//     glog warning naming why nothing is lost, or refused where dropping them would change
//     the training (fp16: true, lora_dropout > 0, optim: sgd);
//  1. each alias key becomes its field (a value the field already has must be equal, or the
//     spec is refused naming both); lr_scheduler_type's transformers values map onto the
//     closed set (constant_with_warmup -> constant, cosine_with_min_lr -> cosine), and
//     transformers' max_steps = -1 ("use the epochs") is dropped;
//  2. each of `overrides` ("key=value": key a dotted field path, an alias or a translated
//     key; value read as YAML, so `lora.target_modules=[q_proj,v_proj]` is a list, and taken
//     as typed by a string field) replaces what the spec says (an override of steps drops the
//     spec's epochs, and the other way round; max_steps=-1 drops steps); one field set by two
//     overrides is refused;
//  3. scalars are fitted to their fields: a number or boolean in a string field becomes its
//     text, a string in a list-of-strings field its comma-separated items;
//  4. every key is checked against JobSpec's fields, recursively, with its nearest valid
//     names (edit distance; a top-level key also against the nested fields, "r" -> lora.r).
// Every problem of steps 0-4 is reported in one error. `source` names the spec in messages
// ("job spec 'a.yaml'").
// Errors: kInvalidArgument listing them: an alias that disagrees with its field, a refused
// foreign key, an override that is not key=value, has no value, is not YAML, repeats a field or
// goes through a field that is not a message, and the unknown keys (at most 20 named).
absl::Status NormalizeSpecJson(const std::vector<std::string>& overrides, absl::string_view source,
                               nlohmann::json* root);

}  // namespace lspo::spec

#endif  // LSPO_SPEC_SPEC_NAMES_H_
