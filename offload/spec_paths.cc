#include "offload/spec_paths.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lspo::offload {

std::vector<runtime::PathField> JobSpecPaths(const lspo::v1::JobSpec& spec) {
  // data.chat_template is a path unless it is the Jinja text itself (text/chat_template.h).
  const std::string& tmpl = spec.data().chat_template();
  const bool tmpl_is_text =
      tmpl.find("{{") != std::string::npos || tmpl.find("{%") != std::string::npos;
  const runtime::PathField fields[] = {
      {"model.path", spec.model().path()},
      {"data.chat_template", tmpl_is_text ? std::string() : tmpl},
      {"model.tokenizer_path", spec.model().tokenizer_path()},
      {"model.adapter_path", spec.model().adapter_path()},
      {"data.train_path", spec.data().train_path()},
      {"data.eval_path", spec.data().eval_path()},
      {"data.perplexity_path", spec.data().perplexity_path()},
      {"output_dir", spec.output_dir()},
      {"resume_from", spec.resume_from() == "latest" ? std::string() : spec.resume_from()},
      {"distributed.rendezvous_token_file", spec.distributed().rendezvous_token_file()},
  };
  std::vector<runtime::PathField> out;
  for (const runtime::PathField& f : fields) {
    if (!f.path.empty()) out.push_back(f);
  }
  return out;
}

absl::Status CheckJobSpecPaths(const lspo::v1::JobSpec& spec, const runtime::AllowedRoots& roots) {
  if (!roots.restricted()) return absl::OkStatus();
  for (const runtime::PathField& f : JobSpecPaths(spec)) {
    if (absl::Status s = roots.CheckWithEntries(absl::StrCat("job spec field ", f.field), f.path);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRequestFolder(const runtime::AllowedRoots& roots, absl::string_view rpc,
                                const std::string& dir) {
  if (!roots.restricted()) return absl::OkStatus();
  const std::string field = absl::StrCat(rpc, " request field dir");
  if (dir.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, " is empty: name a folder under the allowed roots (",
                     absl::StrJoin(roots.roots(), ", "), ")"));
  }
  return roots.CheckWithEntries(field, dir);
}

}  // namespace lspo::offload
