#include "runtime/allowed_roots.h"

#include <sys/stat.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <functional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lspo::runtime {
namespace {

namespace fs = std::filesystem;

// Linux's MAXSYMLINKS: the links one path resolution may follow.
constexpr int kMaxSymlinks = 40;

// Pushes the components of `p` (in order, the root directory left out) to the front of
// `todo`.
void PushFront(const fs::path& p, std::deque<std::string>* todo) {
  std::vector<std::string> parts;
  for (const fs::path& c : p.relative_path()) parts.push_back(c.string());
  todo->insert(todo->begin(), parts.begin(), parts.end());
}

// Whether `p` is `root` or lies under it, component by component (both absolute, free of
// "." and "..", no trailing '/').
bool IsUnder(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

// The result of a resolution.
struct Resolved {
  fs::path path;         // The resolved path; when `stopped`, where it stopped + the rest.
  bool stopped = false;  // A component was outside what `may_look` admits.
  bool loop = false;     // More than kMaxSymlinks links.
};

// Resolves `path` (see the file comment of the header). Before a component is examined,
// `may_look(candidate)` must admit it; when it does not, the walk stops there and the
// result is that candidate followed by the remaining components, lexically (nothing more is
// examined). `path` must not be empty. Errors: kInternal when the working directory cannot
// be read.
absl::StatusOr<Resolved> Resolve(absl::string_view path,
                                 const std::function<bool(const fs::path&)>& may_look) {
  std::error_code ec;
  const fs::path abs = fs::absolute(fs::path(std::string(path)), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot resolve '", path, "' against the working directory: ", ec.message()));
  }
  std::deque<std::string> todo;
  PushFront(abs, &todo);
  Resolved out;
  out.path = "/";
  int links = 0;
  while (!todo.empty()) {
    const std::string c = std::move(todo.front());
    todo.pop_front();
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      out.path = out.path.parent_path();  // "/" stays "/"
      continue;
    }
    fs::path candidate = out.path / c;
    if (!may_look(candidate)) {
      for (const std::string& rest : todo) candidate /= rest;
      out.path = candidate.lexically_normal();
      if (!out.path.has_filename() && out.path != out.path.root_path()) {
        out.path = out.path.parent_path();  // "a/b/" -> "a/b"
      }
      out.stopped = true;
      return out;
    }
    struct stat st {};
    if (::lstat(candidate.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) {
      // A folder or file, or nothing yet (created later as written), or unreadable (the
      // service could not open it either): taken as written.
      out.path = std::move(candidate);
      continue;
    }
    if (++links > kMaxSymlinks) {
      out.loop = true;
      return out;
    }
    const fs::path target = fs::read_symlink(candidate, ec);
    if (ec) {
      out.path = std::move(candidate);  // Vanished or unreadable since the lstat.
      continue;
    }
    if (target.is_absolute()) out.path = "/";
    PushFront(target, &todo);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ResolvePath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("cannot resolve an empty path");
  auto r = Resolve(path, [](const fs::path&) { return true; });
  if (!r.ok()) return r.status();
  if (r->loop) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' has more than ", kMaxSymlinks,
                                                   " symbolic links to follow (a loop?)"));
  }
  return r->path.string();
}

AllowedRoots::AllowedRoots(std::vector<std::string> roots, std::string service, std::string binary)
    : service_(std::move(service)), binary_(std::move(binary)) {
  for (std::string& r : roots) {
    if (!r.empty()) roots_.push_back(std::move(r));
  }
}

absl::Status AllowedRoots::Check(absl::string_view field, absl::string_view path) const {
  return CheckResolved(field, path, nullptr);
}

absl::Status AllowedRoots::CheckResolved(absl::string_view field, absl::string_view path,
                                         std::string* resolved_path) const {
  if (roots_.empty() || path.empty()) return absl::OkStatus();
  // Each root as given (absolute, lexically normal: the ancestors a path may pass on its way
  // to a root that is reached through a link) and resolved (where paths must end).
  std::vector<fs::path> given, resolved;
  for (const std::string& r : roots_) {
    std::error_code ec;
    fs::path g = fs::absolute(fs::path(r), ec).lexically_normal();
    if (!g.has_filename() && g != g.root_path()) g = g.parent_path();
    if (!ec) given.push_back(std::move(g));
    // A root that cannot be resolved (a link loop, no working directory) admits nothing.
    if (auto res = ResolvePath(r); res.ok()) resolved.emplace_back(*res);
  }
  auto may_look = [&](const fs::path& p) {
    for (const auto* set : {&resolved, &given}) {
      for (const fs::path& root : *set) {
        if (IsUnder(p, root) || IsUnder(root, p)) return true;
      }
    }
    return false;
  };
  auto r = Resolve(path, may_look);
  if (!r.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": '", path,
                                                    "' cannot be checked against the ", service_,
                                                    "'s allowed roots: ", r.status().message()));
  }
  if (r->loop) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": '", path, "' has more than ", kMaxSymlinks,
                     " symbolic links to follow (a loop?), so the ", service_,
                     " cannot tell whether it lies under its allowed roots (",
                     absl::StrJoin(roots_, ", "), "): give the path without the loop"));
  }
  if (!r->stopped) {
    for (const fs::path& root : resolved) {
      if (IsUnder(r->path, root)) {
        if (resolved_path != nullptr) *resolved_path = r->path.string();
        return absl::OkStatus();
      }
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": '", path, "' (", r->path.string(), ") is outside the ", service_,
                   "'s allowed roots (", absl::StrJoin(roots_, ", "),
                   "): move the file or folder under one of them or start ", binary_,
                   " with --allowed_roots naming a folder that holds it"));
}

absl::Status AllowedRoots::CheckAll(absl::Span<const PathField> fields) const {
  for (const PathField& f : fields) {
    if (absl::Status s = Check(f.field, f.path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status AllowedRoots::CheckWithEntries(absl::string_view field, absl::string_view path) const {
  if (roots_.empty() || path.empty()) return absl::OkStatus();
  std::string resolved;
  if (absl::Status s = CheckResolved(field, path, &resolved); !s.ok()) return s;
  std::error_code ec;
  if (!fs::is_directory(resolved, ec)) return absl::OkStatus();
  // Entries in name order, so that the first refusal does not depend on the listing's order.
  std::vector<std::string> links;
  for (fs::directory_iterator it(resolved, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code link_ec;
    if (it->is_symlink(link_ec)) links.push_back(it->path().filename().string());
  }
  std::sort(links.begin(), links.end());
  const std::string base(path);
  for (const std::string& name : links) {
    if (absl::Status s =
            Check(absl::StrCat(field, ", entry ", name), (fs::path(base) / name).string());
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace lspo::runtime
