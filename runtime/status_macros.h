// Thin stand-ins for Abseil's status macros, which Debian's Abseil 20220623 does not ship.
// Upstream names are kept so that an Abseil upgrade can delete this file.
#ifndef LSPO_RUNTIME_STATUS_MACROS_H_
#define LSPO_RUNTIME_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LSPO_CONCAT_INNER_(a, b) a##b
#define LSPO_CONCAT_(a, b) LSPO_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#ifndef RETURN_IF_ERROR
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status lspo_status_ = (expr);        \
    if (!lspo_status_.ok()) return lspo_status_; \
  } while (0)
#endif

// `ASSIGN_OR_RETURN(lhs, rexpr)`: evaluates `rexpr` (an absl::StatusOr<T>); on error returns
// its status, else move-assigns the value to `lhs` (which may be a declaration).
#ifndef ASSIGN_OR_RETURN
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  LSPO_ASSIGN_OR_RETURN_IMPL_(LSPO_CONCAT_(lspo_statusor_, __LINE__), lhs, rexpr)
#define LSPO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
#endif

#endif  // LSPO_RUNTIME_STATUS_MACROS_H_
