"""Macros for the torch-free CUDA parts (lsp/cuda/, tests/lsp/cuda/).

They declare targets only when @local_cuda found a toolkit (HAS_CUDA), like CMake's
`if(LSPO_HAS_CUDA)` blocks.
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

# CMake: CMAKE_CUDA_ARCHITECTURES defaults to "80 90" (SASS + PTX for each).
CUDA_ARCHITECTURES = ["80", "90"]

def if_cuda(if_true, if_false = []):
    """Returns if_true when the CUDA toolkit was found, else if_false."""
    return if_true if HAS_CUDA else if_false

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_inputs = [], visibility = None, **kwargs):
    """A cc_library from .cu files compiled by nvcc (-Xcompiler -fPIC) into a static archive.

    Links cudart and cuSPARSE. Keep torch out of these files (nvcc + torch headers: 30-75 s).
    Declares nothing when no CUDA toolkit was found.

    Args:
      name: the cc_library's name; the nvcc genrule is name + "_nvcc".
      srcs: .cu files.
      hdrs: headers of the library (also inputs of nvcc; included relative to the repo root).
      deps: further cc_library deps of the wrapper.
      nvcc_inputs: further files nvcc reads (headers of other packages, exported there).
      visibility: of the cc_library.
      **kwargs: passed to the cc_library (e.g. testonly).
    """
    if not HAS_CUDA:
        return
    gencode = " ".join([
        "--generate-code=arch=compute_%s,code=[compute_%s,sm_%s]" % (a, a, a)
        for a in CUDA_ARCHITECTURES
    ])
    archive = "lib%s_nvcc.a" % name
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + nvcc_inputs,
        outs = [archive],
        cmd = " ".join([
            NVCC,
            "-lib -std=c++17 -O3 -DNDEBUG -Xcompiler -fPIC",
            "-I. -I$(GENDIR)",
            gencode,
            " ".join(["$(location %s)" % s for s in srcs]),
            "-o $@",
        ]),
        message = "nvcc " + " ".join(srcs),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [":" + archive],
        hdrs = hdrs,
        deps = deps + [
            "@local_cuda//:cudart",
            "@local_cuda//:cusparse",
        ],
        visibility = visibility,
        **kwargs
    )
