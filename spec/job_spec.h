// JobSpec I/O and validation: read a job from JSON or YAML (protobuf JSON mapping), fill the
// documented defaults (proto/job_spec.proto), and reject bad specs with a message that names
// the field and the fix.
#ifndef LSPO_SPEC_JOB_SPEC_H_
#define LSPO_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job_spec.pb.h"

namespace lspo::spec {

// Parses a JobSpec from JSON text (protobuf JSON mapping: lowerCamelCase or snake_case field
// names, closed sets by short or enum name, e.g. "mode": "lsp" or "MODE_LSP"), after
// spec_names.h's NormalizeSpecJson: the transformers / TRL / Axolotl aliases
// (learning_rate, max_steps, ...) become their fields, `overrides` ("key=value", lspctl run's
// arguments) replace what the text says, and every unknown key is reported at once with the
// nearest valid names. Errors: kInvalidArgument naming `source` and the problem (malformed
// JSON with its position, unknown keys, an alias that disagrees with its field, a bad value).
absl::StatusOr<lspo::v1::JobSpec> ParseJobSpecJson(absl::string_view json,
                                                   absl::string_view source = "<json>",
                                                   const std::vector<std::string>& overrides = {});

// Parses YAML by converting it to JSON first (yaml-cpp; spec_names.h YamlToJson: scalars that
// look like numbers or booleans are emitted as such), then as above.
absl::StatusOr<lspo::v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml,
                                                   absl::string_view source = "<yaml>",
                                                   const std::vector<std::string>& overrides = {});

// Reads a .json, .yaml or .yml file, then as above. kNotFound if it cannot be read,
// kInvalidArgument for an unknown extension or malformed content.
absl::StatusOr<lspo::v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                                  const std::vector<std::string>& overrides = {});

// Renders a spec as pretty JSON (for logs and summary files).
std::string JobSpecToJson(const lspo::v1::JobSpec& spec);

// Fills every zero/empty field that has a documented default (see the proto comments), except
// those a CUDA worker chooses to fit its device (activation_checkpointing; micro_batch_size
// unless the job runs on the CPU or is data parallel: issue 42).
void ResolveDefaults(lspo::v1::JobSpec* spec);

// The steps of a job that gives `epochs` instead of `steps`, once the worker has loaded
// `train_rows` training rows (LoadJobReply.train_examples): ceil(epochs * max(1,
// floor(ceil(train_rows / (micro_batch_size * world_size)) / grad_accum))), as transformers'
// Trainer counts an epoch (len(dataloader) // gradient_accumulation_steps, at least 1; the
// dataloader keeps its last partial batch). At least 1, at most INT32_MAX. Needs
// micro_batch_size resolved (the worker's choice on CUDA).
int StepsForEpochs(const lspo::v1::JobSpec& spec, int64_t train_rows);

// For a job resumed from a checkpoint: the settings chosen at load that `spec` leaves unset
// (micro_batch_size, lsp.apply_rounding, lsp.refresh_every) are taken from the checkpoint's
// training fingerprint (the spec it trained with), so the resumed job trains the batch and the
// rounding it trained before whatever device it now runs on; an unset rounding in a fingerprint
// is compensated (the default before 2026-12-07), an unset refresh_every 0. Nothing changes
// when the fingerprint cannot be read (SameTraining then refuses it).
void TakeChosenSettingsFrom(const std::string& fingerprint, lspo::v1::JobSpec* spec);

// Checks a spec with defaults resolved: value ranges (d >= 1, 1 <= r <= d, steps >= 1, ...),
// known formats and modes, and that model/data files exist and are readable.
// `check_data_files` false (lspctl plan, which reads only the model): the files the model does
// not need (data.*, model.adapter_path, resume_from) are not looked for.
// Errors: kInvalidArgument naming the field, the value and the fix; kNotFound for a missing
// file (naming the field and the path).
absl::Status ValidateJobSpec(const lspo::v1::JobSpec& spec, bool check_data_files = true);

// Path checks for a multi-user service: every path the spec reads or writes
// (offload::JobSpecPaths: model.path, model.tokenizer_path, model.adapter_path,
// data.chat_template given as a path, data.*_path, output_dir, resume_from,
// distributed.rendezvous_token_file) must resolve under one of `roots`, as the kernel
// resolves it: relative paths against the working directory, ".." and symlinks component by
// component (runtime/allowed_roots.h). Nothing outside the roots is looked at, so the answer
// does not depend on which files exist there. Empty `roots` = no restriction.
// Errors: kPermissionDenied naming the field, the path, where it resolves, the roots and the
// fix (--allowed_roots of lsp_scheduler).
absl::Status CheckPathsUnderRoots(const lspo::v1::JobSpec& spec,
                                  const std::vector<std::string>& roots);

// The spec fields that determine the training trajectory, as canonical JSON: two specs with
// the same fingerprint train bitwise identically step for step (name, steps, output and
// checkpoint settings, evaluation, threads, the offload schedule, the device memory cap and a
// data-parallel job's rank, rendezvous, bind address and timeout are excluded; its world size
// is kept, since it changes the batch). A resumed job must match its checkpoint's fingerprint.
std::string TrainingFingerprint(lspo::v1::JobSpec spec);

// Whether `fingerprint` (a TrainingFingerprint, possibly written by an earlier version whose
// closed sets were strings) names the same training as `spec`: compared as specs, not text.
bool SameTraining(const std::string& fingerprint, const lspo::v1::JobSpec& spec);

// What differs between the training of `fingerprint` and of `spec`, as
// runtime::ProtoDifferences lists it ("modified: optim.lr: 0.0003 -> 0.0006"); "" when
// SameTraining; "the fingerprint cannot be read" when it does not parse.
std::string TrainingDifferences(const std::string& fingerprint, const lspo::v1::JobSpec& spec);

}  // namespace lspo::spec

#endif  // LSPO_SPEC_JOB_SPEC_H_
