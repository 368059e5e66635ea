// Model ids ("HuggingFaceTB/SmolLM2-135M-Instruct") resolved from the local Hugging Face cache,
// as transformers' from_pretrained finds them offline: no network access is made or needed.
//
// The cache layout (huggingface_hub's file-download cache, the one transformers >= 4.22 and
// `huggingface-cli download` write):
//   <cache>/models--<org>--<name>/refs/<revision>     the commit hash the revision points at
//   <cache>/models--<org>--<name>/snapshots/<commit>/ the repository's files (links to blobs/)
// <cache> is HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE (its older name), else HF_HOME/hub, else
// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (huggingface_hub constants).
//
// Thread-safety: reads the environment and the file system only.
#ifndef LSPO_RUNTIME_HF_CACHE_H_
#define LSPO_RUNTIME_HF_CACHE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::runtime {

// True when `path` has the shape of a Hub model id: "org/name" (exactly one '/', each part
// non-empty, made of letters, digits, '-', '_' and '.', not starting with '.' or '-', no "..").
// An id and a relative path "dir/file" look alike: callers try the file system first.
bool LooksLikeModelId(absl::string_view path);

// The Hugging Face hub cache folder this process would read (see the file comment); not
// checked for existence.
std::string HfHubCacheDir();

// The snapshot folder of model id `id` (LooksLikeModelId) in HfHubCacheDir(): the commit
// refs/main names, or the only snapshot when refs/main is absent. Returns the folder path.
// Errors: kInvalidArgument when `id` is no model id; kNotFound naming the cache folder, the
// folder looked for (models--org--name) and the fix (download the model, or set HF_HUB_CACHE /
// HF_HOME) when the model is not cached, or when refs/main names a snapshot that is absent;
// kFailedPrecondition when refs/main is absent and several snapshots exist (they are listed;
// give the snapshot folder as the path).
absl::StatusOr<std::string> ResolveHfCacheModel(absl::string_view id);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_HF_CACHE_H_
