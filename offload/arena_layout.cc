#include "offload/arena_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

using lspo::v1::TensorRef;

uint64_t ElementBytes(lspo::v1::DType dtype) { return dtype == lspo::v1::BF16 ? 2 : 4; }

TensorRef MakeRef(uint64_t* cursor, lspo::v1::DType dtype, std::vector<int64_t> shape) {
  TensorRef ref;
  ref.set_offset(*cursor);
  ref.set_dtype(dtype);
  uint64_t numel = 1;
  for (int64_t s : shape) {
    ref.add_shape(s);
    numel *= static_cast<uint64_t>(s);
  }
  *cursor += runtime::AlignUp64(numel * ElementBytes(dtype));
  return ref;
}

// A new slot of `layout` naming linear `l` (index, HF name, m, n); regions are added by the
// caller.
lspo::v1::LinearSlot* AddSlot(const LinearShape& l, lspo::v1::ArenaLayout* layout) {
  auto* slot = layout->add_linears();
  slot->set_index(l.index);
  slot->set_name(l.name);
  slot->set_m(l.m);
  slot->set_n(l.n);
  return slot;
}

// The completion flags: 2 + 2 L uint32 words (runtime/completion_flags.h).
void AddFlags(const std::vector<LinearShape>& linears, lspo::v1::ArenaLayout* layout,
              uint64_t* cursor) {
  *layout->mutable_flags() =
      MakeRef(cursor, lspo::v1::I32,
              {runtime::CompletionFlags::Words(static_cast<int64_t>(linears.size()))});
}

// The one-layer fp32 staging region (`per_layer` matrices in linear order).
void AddStaging(const std::vector<LinearShape>& linears, size_t per_layer,
                lspo::v1::ArenaLayout* layout, uint64_t* cursor) {
  int64_t largest_layer = 0;
  for (size_t s = 0; s < linears.size(); s += per_layer) {
    int64_t layer = 0;
    for (size_t k = s; k < std::min(linears.size(), s + per_layer); ++k) {
      layer += linears[k].m * linears[k].n;
    }
    largest_layer = std::max(largest_layer, layer);
  }
  *layout->mutable_staging() =
      MakeRef(cursor, lspo::v1::F32, {std::max<int64_t>(largest_layer, 1)});
}

absl::Status CheckPerLayer(const std::vector<LinearShape>& linears, int32_t per_layer) {
  if (per_layer < 1 || linears.size() % static_cast<size_t>(per_layer) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena layout: ", linears.size(), " trained matrices do not split into decoder layers of ",
        per_layer, " matrices each"));
  }
  return absl::OkStatus();
}

// BuildArenaLayout for `mode` MODE_LSP or MODE_GALORE_OFFLOAD (which adds the grad_sq slots).
absl::StatusOr<lspo::v1::ArenaLayout> BuildSubspaceLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer,
    const std::vector<lsp::MatrixSubspace>& subspaces, int32_t d, int32_t r,
    const std::string& name, lspo::v1::TrainingMode mode) {
  RETURN_IF_ERROR(CheckPerLayer(linears, linears_per_layer));
  if (subspaces.size() != linears.size()) {
    return absl::InvalidArgumentError(absl::StrCat("arena layout: ", subspaces.size(),
                                                   " subspaces for ", linears.size(), " matrices"));
  }
  for (size_t i = 0; i < linears.size(); ++i) {
    const LinearShape& l = linears[i];
    const lsp::MatrixSubspace& s = subspaces[i];
    const auto side_ok = [](const lsp::SideSubspace& side, int64_t rows) {
      return side.rows == rows && side.dim >= 1 && side.r >= 1 && side.r <= side.dim &&
             (!side.identity || (side.dim == rows && side.r == 1));
    };
    if (!side_ok(s.p, l.m) || !side_ok(s.q, l.n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("arena layout: the subspace of ", l.name, " (", l.m, " x ", l.n, ") is P (",
                       s.p.rows, ", ", s.p.dim, ") r ", s.p.r, ", Q (", s.q.rows, ", ", s.q.dim,
                       ") r ", s.q.r, "; expected P (m, d_p), Q (n, d_q) with 1 <= r <= d"));
    }
  }
  lspo::v1::ArenaLayout layout;
  layout.set_name(name);
  layout.set_linears_per_layer(linears_per_layer);
  layout.set_d(d);
  layout.set_r(r);
  uint64_t cursor = 0;
  for (size_t i = 0; i < linears.size(); ++i) {
    const LinearShape& l = linears[i];
    const lsp::MatrixSubspace& s = subspaces[i];
    auto* slot = AddSlot(l, &layout);
    slot->set_d_p(static_cast<int32_t>(s.p.dim));
    slot->set_d_q(static_cast<int32_t>(s.q.dim));
    *slot->mutable_grad() = MakeRef(&cursor, lspo::v1::F32, {s.p.dim, s.q.dim});
    *slot->mutable_step() = MakeRef(&cursor, lspo::v1::F32, {s.p.dim, s.q.dim});
    *slot->mutable_p_index() = MakeRef(&cursor, lspo::v1::I32, {l.m, s.p.r});
    *slot->mutable_p_value() = MakeRef(&cursor, lspo::v1::F32, {l.m, s.p.r});
    *slot->mutable_q_index() = MakeRef(&cursor, lspo::v1::I32, {l.n, s.q.r});
    *slot->mutable_q_value() = MakeRef(&cursor, lspo::v1::F32, {l.n, s.q.r});
    if (mode == lspo::v1::MODE_GALORE_OFFLOAD) {
      *slot->mutable_grad_sq() = MakeRef(&cursor, lspo::v1::F32, {1});
    }
  }
  AddFlags(linears, &layout, &cursor);
  AddStaging(linears, static_cast<size_t>(linears_per_layer), &layout, &cursor);
  layout.set_mode(mode);
  layout.set_bytes(std::max<uint64_t>(cursor, 64));
  return layout;
}

// lsp.narrow as lsp/subspace.h's rule (UNSPECIFIED = one-sided, proto/job_spec.proto).
lsp::NarrowRule NarrowRuleOf(lspo::v1::NarrowRule rule) {
  switch (rule) {
    case lspo::v1::NARROW_RULE_HALF:
      return lsp::NarrowRule::kHalf;
    case lspo::v1::NARROW_RULE_FULL:
      return lsp::NarrowRule::kFull;
    default:
      return lsp::NarrowRule::kOneSided;
  }
}

}  // namespace

absl::StatusOr<std::vector<lsp::MatrixSubspace>> ResolveJobSubspaces(
    const std::vector<LinearShape>& linears, const lspo::v1::LspSpec& lsp) {
  std::vector<lsp::MatrixSubspace> subspaces;
  subspaces.reserve(linears.size());
  for (const auto& l : linears) {
    absl::StatusOr<lsp::MatrixSubspace> s =
        lsp::ResolveSubspace(l.m, l.n, lsp.d(), lsp.d_ratio(), lsp.r(), NarrowRuleOf(lsp.narrow()));
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("job spec field lsp does not fit ", l.name,
                                                     " (", l.m, " x ", l.n,
                                                     "): ", s.status().message()));
    }
    subspaces.push_back(*s);
  }
  return subspaces;
}

absl::StatusOr<lspo::v1::ArenaLayout> BuildArenaLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer,
    const std::vector<lsp::MatrixSubspace>& subspaces, int32_t d, int32_t r,
    const std::string& name) {
  return BuildSubspaceLayout(linears, linears_per_layer, subspaces, d, r, name, lspo::v1::MODE_LSP);
}

absl::StatusOr<lspo::v1::ArenaLayout> BuildGaloreArenaLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer, int32_t rank,
    const std::string& name) {
  const LinearShape* narrowest = nullptr;
  for (const LinearShape& l : linears) {
    if (narrowest == nullptr || std::min(l.m, l.n) < std::min(narrowest->m, narrowest->n)) {
      narrowest = &l;
    }
  }
  if (rank < 1 || (narrowest != nullptr && rank >= std::min(narrowest->m, narrowest->n))) {
    const int64_t side = narrowest == nullptr ? 0 : std::min(narrowest->m, narrowest->n);
    return absl::InvalidArgumentError(absl::StrCat(
        "galore.rank = ", rank, " with galore.offload: the rank must be >= 1 and below the ",
        "smaller side of every trained matrix",
        narrowest == nullptr
            ? std::string()
            : absl::StrCat(" (the narrowest is ", narrowest->name, ", ", narrowest->m, " x ",
                           narrowest->n, "): use a rank <= ", side - 1)));
  }
  std::vector<lsp::MatrixSubspace> subspaces;
  subspaces.reserve(linears.size());
  for (const LinearShape& l : linears) {
    const lsp::SideSubspace identity_p{l.m, l.m, 1, true}, identity_q{l.n, l.n, 1, true};
    const lsp::SideSubspace dense_p{l.m, rank, rank, false}, dense_q{l.n, rank, rank, false};
    // GaLore's side rule (baselines/galore.h GaloreSideOf): right (project n) when m >= n.
    subspaces.push_back(l.m >= l.n ? lsp::MatrixSubspace{identity_p, dense_q}
                                   : lsp::MatrixSubspace{dense_p, identity_q});
  }
  return BuildSubspaceLayout(linears, linears_per_layer, subspaces, rank, rank, name,
                             lspo::v1::MODE_GALORE_OFFLOAD);
}

absl::StatusOr<lspo::v1::ArenaLayout> BuildZeroArenaLayout(const std::vector<LinearShape>& linears,
                                                           int32_t linears_per_layer,
                                                           const std::string& name) {
  RETURN_IF_ERROR(CheckPerLayer(linears, linears_per_layer));
  lspo::v1::ArenaLayout layout;
  layout.set_name(name);
  layout.set_linears_per_layer(linears_per_layer);
  uint64_t cursor = 0;
  for (const LinearShape& l : linears) {
    auto* slot = AddSlot(l, &layout);
    *slot->mutable_full_grad() = MakeRef(&cursor, lspo::v1::BF16, {l.m, l.n});
    *slot->mutable_param() = MakeRef(&cursor, lspo::v1::BF16, {l.m, l.n});
  }
  AddFlags(linears, &layout, &cursor);
  layout.set_mode(lspo::v1::MODE_ZERO);
  layout.set_bytes(std::max<uint64_t>(cursor, 64));
  return layout;
}

absl::StatusOr<int32_t> NumLayers(const lspo::v1::ArenaLayout& layout) {
  const int32_t k = layout.linears_per_layer();
  if (k < 1 || layout.linears_size() % k != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena layout ", layout.name(), ": linears_per_layer = ", k,
                     " does not split its ", layout.linears_size(),
                     " matrices into layers (worker and optimizer of different "
                     "versions?)"));
  }
  return layout.linears_size() / k;
}

lsp::MatrixSubspace SlotSubspace(const lspo::v1::LinearSlot& slot) {
  const auto side = [](int64_t rows, int64_t dim, const lspo::v1::TensorRef& index) {
    lsp::SideSubspace s;
    if (dim < 1 || index.shape_size() != 2) return s;
    s.rows = rows;
    s.dim = dim;
    s.r = index.shape(1);
    s.identity = dim == rows;
    return s;
  };
  return lsp::MatrixSubspace{side(slot.m(), slot.d_p(), slot.p_index()),
                             side(slot.n(), slot.d_q(), slot.q_index())};
}

int64_t Numel(const lspo::v1::TensorRef& ref) {
  int64_t n = 1;
  for (int64_t s : ref.shape()) n *= s;
  return n;
}

}  // namespace lspo::offload
