// The folders a multi-user service may touch (--allowed_roots, issue 43): every file or folder
// a request names must resolve, as the kernel resolves it when the service opens it, to a
// place under one of the configured roots. The scheduler checks a job spec's paths at Submit,
// the worker and the optimizer every path of their RPCs (LoadJob's spec, SaveArtifacts /
// SaveModel / SaveState / LoadState's folder) before they open anything.
//
// Resolution (ResolvePath): a relative path is taken against the working directory; then the
// components in order: "." is dropped; ".." goes to the parent of what is resolved so far
// (which holds no symlink, so this is the kernel's "..", not a lexical one); a symlink is
// replaced by its target (a relative target against the link's folder), followed again if
// the target holds links, up to 40 links (Linux's limit, so a loop ends); a component that
// does not exist (a file or folder the service would create) is taken as written.
//
// What is looked at: a check examines (lstat, readlink) only the roots, their ancestors and
// what lies under the roots. A path that leaves them is refused at its first component
// outside, before anything there is looked at: the answer and its message are the same
// whether or not the file outside exists, so a refused request learns nothing of what lies
// outside the roots.
//
// Not covered: a link created or swapped inside a root between the check and the open (the
// check runs when the request arrives; whoever can write links into a root can redirect a
// later open).
//
// Thread-safety: AllowedRoots is immutable after construction; its methods may be called
// concurrently. ResolvePath is stateless (it reads the working directory).
#ifndef LSPO_RUNTIME_ALLOWED_ROOTS_H_
#define LSPO_RUNTIME_ALLOWED_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lspo::runtime {

// One path-valued field of a request: `field` names it in errors (e.g. "job spec field
// model.path", "SaveState request field dir"), `path` is its value as given.
struct PathField {
  std::string field;
  std::string path;
};

// Resolves `path` as described in the file comment, with no restriction on what is looked at,
// and returns the absolute, normal result (no "." or ".." components, no trailing '/').
// Errors: kInvalidArgument when more than 40 symlinks would be followed (a loop), naming the
// path; kInvalidArgument for an empty path; kInternal when the working directory cannot be
// read (for a relative path).
absl::StatusOr<std::string> ResolvePath(absl::string_view path);

// The allowed roots of one service. Empty = no restriction (every Check passes).
class AllowedRoots {
 public:
  // No restriction.
  AllowedRoots() = default;

  // `roots`: the folders paths must lie under (absolute, or relative to the working
  // directory; they need not exist; they are resolved like the paths, at each check; empty
  // entries are ignored, none at all = no restriction). `service` ("worker") and `binary`
  // ("lsp_gpu_worker") name who refuses a path and whose --allowed_roots would admit it, in
  // the errors.
  AllowedRoots(std::vector<std::string> roots, std::string service, std::string binary);

  // Whether any root is set (false: every path is allowed).
  bool restricted() const { return !roots_.empty(); }
  // The roots as given (empty entries dropped).
  const std::vector<std::string>& roots() const { return roots_; }

  // OK when `path` resolves (ResolvePath) to one of the roots or to a place under one; OK
  // for an empty `path` (an unset field) and when no root is set.
  // Errors: kPermissionDenied "<field>: '<path>' (<resolved>) is outside the <service>'s
  // allowed roots (<roots>): move the file or folder under one of them or start <binary>
  // with --allowed_roots naming a folder that holds it", where <resolved> is the resolved
  // path, or, for a path that leaves the roots, the place where it leaves them followed by
  // the rest as written (nothing outside the roots is looked at: see the file comment);
  // kPermissionDenied, naming the field and the path, when more than 40 symlinks would be
  // followed.
  absl::Status Check(absl::string_view field, absl::string_view path) const;

  // Check() of each field in order; the first refusal, or OK.
  absl::Status CheckAll(absl::Span<const PathField> fields) const;

  // Check(field, path), then, when `path` is a folder, Check() of each of its entries that is
  // a symlink, named "<field>, entry <name>": the files a service opens by name in a folder it
  // was given (a model folder's config.json and weights, a checkpoint's state files, the
  // files of an output folder) may themselves be links that lead out. One level deep: the
  // links in sub-folders of `path` are not looked at. The folder is listed only once it is
  // known to lie under the roots. Errors: Check's.
  absl::Status CheckWithEntries(absl::string_view field, absl::string_view path) const;

 private:
  // Check(field, path); on success `*resolved` is where `path` resolves (when non-null).
  absl::Status CheckResolved(absl::string_view field, absl::string_view path,
                             std::string* resolved) const;

  std::vector<std::string> roots_;
  std::string service_ = "service";
  std::string binary_ = "the service";
};

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_ALLOWED_ROOTS_H_
