// The files and folders a job spec names, for the --allowed_roots checks of the three services
// (runtime/allowed_roots.h, issue 43): the scheduler checks them at Submit, the worker and the
// optimizer again at LoadJob, with one field list. Torch-free (protobuf messages only): the
// scheduler links it.
#ifndef LSPO_OFFLOAD_SPEC_PATHS_H_
#define LSPO_OFFLOAD_SPEC_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/job_spec.pb.h"
#include "runtime/allowed_roots.h"

namespace lspo::offload {

// Every path `spec` reads or writes, as (field, path) with the field's name in the spec
// ("model.path"): model.path, data.chat_template (when it is a path: it holds neither "{{"
// nor "{%"; Jinja text is not a path), model.tokenizer_path, model.adapter_path,
// data.train_path, data.eval_path, data.perplexity_path, output_dir, resume_from (unless
// "latest", which is under output_dir) and distributed.rendezvous_token_file (its contents go
// to the rendezvous address as a bearer token). Unset fields are left out.
std::vector<runtime::PathField> JobSpecPaths(const lspo::v1::JobSpec& spec);

// roots.CheckWithEntries of each of JobSpecPaths(spec), named "job spec field <name>": the
// path, and, for a folder (an HF model folder, a PEFT adapter, a checkpoint, the output
// folder), the links among its entries.
// Errors: kPermissionDenied naming the first field (or entry) outside the roots, its path,
// where it resolves, the roots and the fix (AllowedRoots::Check). OK when `roots` sets no
// root.
absl::Status CheckJobSpecPaths(const lspo::v1::JobSpec& spec, const runtime::AllowedRoots& roots);

// The roots check of a request's folder field `dir` (SaveRequest.dir, StateRequest.dir) of the
// RPC `rpc` ("SaveState"): roots.CheckWithEntries, so the folder and the links among its
// entries (files the service then opens or replaces by name), named "<rpc> request field
// dir". Run before any of them is opened.
// Errors: kPermissionDenied naming the field (or entry), the path, where it resolves, the
// roots and the fix; kPermissionDenied when `dir` is empty and roots are set (the files would
// land in the working directory or "/"). OK when `roots` sets no root.
absl::Status CheckRequestFolder(const runtime::AllowedRoots& roots, absl::string_view rpc,
                                const std::string& dir);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_SPEC_PATHS_H_
