// Converts LibTorch exceptions into absl::Status at the service boundary.
#ifndef LSPO_OFFLOAD_TORCH_CALL_H_
#define LSPO_OFFLOAD_TORCH_CALL_H_

#include <exception>

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lspo::offload {

// Runs `fn` (returning absl::Status); a c10::Error or std::exception thrown inside (bad
// shapes, allocation failure) becomes kInternal naming `what`. No exception escapes.
template <typename Fn>
absl::Status TorchCall(absl::string_view what, Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_TORCH_CALL_H_
