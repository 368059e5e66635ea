#!/usr/bin/env python3
"""GaLore oracle for tests/baselines/galore_test.cc (baselines/galore.h).

Runs the galore-torch package's AdamW (PyPI galore-torch 1.0, proj_type "std") on three small
fp32 matrices with a fixed, seeded sequence of gradients (the gradients do not depend on the
weights, so the C++ side can feed the same ones) and records the weights after each step:

  right    W (12, 8):  m >= n, projector B (r, n) from V^T
  left     W (6, 10):  m <  n, projector A (m, r) from U
  square   W (8, 8):   m == n, right

Two runs, rank 3, scale 0.25, lr 0.02, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1:

  period   update_proj_gap 200, 4 steps: one projector for the whole run. galore-torch exactly
           as published (within one projector period the update does not depend on the SVD's
           signs, so the LAPACK build does not matter).
  refresh  update_proj_gap 2, 5 steps: new projectors at steps 1, 3 and 5 with the moments
           kept. galore-torch with one change, the one baselines/galore.h makes on purpose:
           each singular vector's sign is made canonical (entry of largest magnitude
           positive), so that the result does not depend on the LAPACK build.

Writes tests/oracle/data/galore_oracle.json: settings, w0 and grads (per matrix, per step),
and per run the weights after every step (float64 lists of the fp32 values) and, for the
refresh run, the final projectors.

Run from the repository root with torch and galore-torch from PyPI (the venv of
scripts/bench_peers_setup plus `pip install galore-torch transformers`):
  .venv-bench/bin/python tests/oracle/make_galore_oracle.py
"""
import json
import warnings

import torch
import galore_torch
from galore_torch import GaLoreAdamW
from galore_torch.galore_projector import GaLoreProjector

SHAPES = {"right": (12, 8), "left": (6, 10), "square": (8, 8)}
SETTINGS = dict(rank=3, scale=0.25, lr=0.02, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.1)
RUNS = {"period": dict(update_proj_gap=200, steps=4, canonical=False),
        "refresh": dict(update_proj_gap=2, steps=5, canonical=True)}


def canonical(t, vec_dim):
    """Flips each singular vector (rows of B: vec_dim 0; columns of A: 1) so that its entry
    of largest magnitude is positive."""
    along = 1 - vec_dim
    idx = t.abs().argmax(dim=along, keepdim=True)
    sgn = t.gather(along, idx).sign()
    sgn[sgn == 0] = 1
    return t * sgn


_original = GaLoreProjector.get_orthogonal_matrix


def canonical_orthogonal_matrix(self, weights, rank, type):
    out = _original(self, weights, rank, type)
    out = canonical(out, 0 if type == "right" else 1)
    self.ortho_matrix = out
    return out


def run(w0, grads, gap, steps, use_canonical):
    GaLoreProjector.get_orthogonal_matrix = (canonical_orthogonal_matrix if use_canonical
                                             else _original)
    params = {k: torch.nn.Parameter(v.clone()) for k, v in w0.items()}
    group = {"params": list(params.values()), "rank": SETTINGS["rank"],
             "update_proj_gap": gap, "scale": SETTINGS["scale"], "proj_type": "std",
             "proj_quant": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = GaLoreAdamW([group], lr=SETTINGS["lr"],
                          betas=(SETTINGS["beta1"], SETTINGS["beta2"]), eps=SETTINGS["eps"],
                          weight_decay=SETTINGS["weight_decay"])
    after = {k: [] for k in params}
    for t in range(steps):
        for k, p in params.items():
            p.grad = grads[k][t].clone()
        opt.step()
        for k, p in params.items():
            after[k].append(p.detach().double().tolist())
    projectors = {k: opt.state[p]["projector"].ortho_matrix.double().tolist()
                  for k, p in params.items()}
    GaLoreProjector.get_orthogonal_matrix = _original
    return after, projectors


def main():
    gen = torch.Generator().manual_seed(20261202)
    w0 = {k: torch.randn(s, generator=gen) * 0.5 for k, s in SHAPES.items()}
    max_steps = max(r["steps"] for r in RUNS.values())
    grads = {k: [torch.randn(s, generator=gen) * (0.1 * (t + 1)) for t in range(max_steps)]
             for k, s in SHAPES.items()}
    out = {"source": f"galore-torch {getattr(galore_torch, '__version__', '1.0')}, "
                     f"torch {torch.__version__}",
           "settings": SETTINGS,
           "w0": {k: v.double().tolist() for k, v in w0.items()},
           "grads": {k: [g.double().tolist() for g in gs] for k, gs in grads.items()},
           "runs": {}}
    for name, r in RUNS.items():
        after, projectors = run(w0, grads, r["update_proj_gap"], r["steps"], r["canonical"])
        out["runs"][name] = {"update_proj_gap": r["update_proj_gap"], "steps": r["steps"],
                             "canonical_signs": r["canonical"], "after": after,
                             "projectors": projectors}
    with open("tests/oracle/data/galore_oracle.json", "w") as f:
        json.dump(out, f)
        f.write("\n")
    print("wrote tests/oracle/data/galore_oracle.json")


if __name__ == "__main__":
    main()
