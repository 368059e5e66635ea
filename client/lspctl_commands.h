// lspctl's parts (client/lspctl.cc: the flags and the dispatch; lspctl_jobs.cc: the job
// commands against a scheduler, and `run`; lspctl_models.cc: the commands on a model without a
// job: plan, convert, generate, eval). Not a library: only the lspctl binary includes it.
#ifndef LSPO_CLIENT_LSPCTL_COMMANDS_H_
#define LSPO_CLIENT_LSPCTL_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "proto/job_spec.pb.h"

ABSL_DECLARE_FLAG(std::string, spec);
ABSL_DECLARE_FLAG(std::string, scheduler);
ABSL_DECLARE_FLAG(std::string, address);
ABSL_DECLARE_FLAG(int32_t, steps);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(std::string, output_dir);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(std::string, bind_address);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(std::string, rendezvous_token_file);
ABSL_DECLARE_FLAG(bool, allow_remote_rendezvous);
ABSL_DECLARE_FLAG(bool, watch);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(bool, verbose);
ABSL_DECLARE_FLAG(bool, skip_memory_check);
ABSL_DECLARE_FLAG(double, timeout_seconds);
ABSL_DECLARE_FLAG(std::string, adapter);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, chat);
ABSL_DECLARE_FLAG(std::string, chat_template);
ABSL_DECLARE_FLAG(int64_t, max_new_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int64_t, top_k);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(int32_t, seq_len);
ABSL_DECLARE_FLAG(int32_t, max_examples);
ABSL_DECLARE_FLAG(std::string, perplexity_path);
ABSL_DECLARE_FLAG(std::string, question);
ABSL_DECLARE_FLAG(std::string, system_prompt);
ABSL_DECLARE_FLAG(double, device_memory_gb);
ABSL_DECLARE_FLAG(double, device_memory_gib);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int32_t, threads);
ABSL_DECLARE_FLAG(std::string, outtype);
ABSL_DECLARE_FLAG(std::string, outfile);

namespace lspo::lspctl {

// Prints "lspctl: <message>" to stderr; returns exit code 1.
int Fail(const absl::Status& status);

// `m` as indented JSON (short enum names; runtime/proto_json.h).
std::string ToJsonString(const google::protobuf::Message& m);

// The job spec of --spec with the command line's overrides: first the `key=value` arguments
// set by SetSpecOverrides (any field by its dotted path or transformers / TRL / Axolotl name,
// spec/spec_names.h), then the flags (--steps, --mode, --schedule, --output_dir, the
// data-parallel flags). Errors: the spec file's (naming it and the field; every unknown key at
// once), kInvalidArgument for a bad override (naming it and the values it takes).
absl::StatusOr<lspo::v1::JobSpec> SpecFromFlags();

// lspctl spec: prints the job spec SpecFromFlags reads (aliases resolved, overrides and flags
// applied, defaults not filled in: what `submit` sends) as JSON with proto field names and
// short enum names (runtime/proto_json.h), for people and for programs (the Python client
// reads specs through it). Returns the exit status: 0, or 2 with the spec's error on stderr.
int PrintSpec();

// The `key=value` arguments of run / submit / plan / spec (`lspctl run --spec=a.yaml optim.lr=3e-4
// max_steps=50`), read by SpecFromFlags.
void SetSpecOverrides(std::vector<std::string> overrides);

// Installs the SIGINT / SIGTERM handling: a job watched by `lspctl run` is cancelled;
// otherwise the process exits with 128 + signal, as by default.
void InstallInterruptHandling();

// `lspctl run`: the embedded runtime trains the --spec job in this process. Returns the exit
// code (0 SUCCEEDED, 1 failed or cancelled, 2 usage).
int RunEmbedded();

// The commands against the scheduler at --scheduler (submit, watch, status, cancel, list,
// metrics, health), `arg` the job id or service. Returns the exit code (2 for an unknown
// command, naming the commands).
int RunJobCommand(const std::string& cmd, const std::string& arg);

// Whether `cmd` is a command on a model without a job (plan, convert, generate, eval).
bool IsModelCommand(const std::string& cmd);

// Runs such a command from the flags. Returns the exit code (0, 1 on an error, 2 usage).
int RunModelCommand(const std::string& cmd);

}  // namespace lspo::lspctl

#endif  // LSPO_CLIENT_LSPCTL_COMMANDS_H_
