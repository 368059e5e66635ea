#!/usr/bin/env python3
"""Tests of scripts/gpu_env.sh and the GPU path of scripts/quickstart and scripts/setup (issue
45, docs/gpu.md "GPU quickstart") on a machine without a GPU, both ways.

Everything runs in the dry-run mode (LSPO_GPU_DRY_RUN=1: the commands that would install torch,
configure, build and train are printed, not run) against fakes in a temporary folder:
  - nvidia-smi (LSPO_NVIDIA_SMI): prints an H100's line, two GPUs, nothing with exit 9, or the
    driver's error message with exit 9;
  - nvcc (LSPO_NVCC): prints a CUDA 13.0 (or 12.8) release line;
  - a torch Python (LSPO_TORCH_PYTHON, or the venv's bin/python): answers the `-c` probe with
    CUDA available or not, the C++11 ABI True or False, a compute capability;
  - a folder first on PATH whose pip, pip3, python3, python, cmake, ninja, apt-get, sudo and
    lspctl only record that they were called: the dry run must call none of them.
A stub `torch` package also runs the real probe with the real Python. Standard library
unittest; run by CTest (tests/CMakeLists.txt, gpu_env_test); about a second."""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = "NVIDIA H100 80GB HBM3, 81559 MiB"
TORCH_ROOT = "/opt/fake-site/torch"
TORCH_CMAKE = TORCH_ROOT + "/share/cmake"
SPEC = "--spec=examples/smollm2-sms-spam.yaml"
OUT = "--output_dir=runs/quickstart"
TRAPPED = ("pip", "pip3", "python3", "python", "cmake", "ninja", "apt-get", "sudo", "lspctl")
# Variables of the caller's shell that would change what the scripts do.
CLEARED = ("LSPO_GPU", "LSPO_TORCH_PYTHON", "LSPO_TORCH_VENV", "LSPO_GPU_BUILD_DIR", "LSPO_NVCC",
           "LSPO_NVIDIA_SMI", "LSPO_CACHE_DIR", "LSPO_GPU_NAME", "LSPO_GPU_REASON",
           "TORCH_CUDA_ARCH_LIST", "LSPO_BUILD_JOBS")


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


class GpuEnvTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lspo-gpu-env-")
        self.log = os.path.join(self.tmp, "calls.log")
        open(self.log, "w").close()
        self.trap = os.path.join(self.tmp, "trap-bin")
        os.mkdir(self.trap)
        for name in TRAPPED:
            write_exe(os.path.join(self.trap, name),
                      f'#!/bin/sh\necho "TRAPPED {name} $*" >>"{self.log}"\nexit 97\n')
        self.gpu_smi = self.smi("gpu", f'printf "%s\\n" "{H100}"', 0)
        self.nvcc13 = self.nvcc("13.0")
        self.torch = self.torch_python("torch-ok")
        self.cache = os.path.join(self.tmp, "cache")
        self.build_cuda_existed = os.path.exists(os.path.join(REPO, "build-cuda"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- fakes
    def smi(self, name, body, rc):
        return write_exe(os.path.join(self.tmp, f"nvidia-smi-{name}"),
                         f'#!/bin/sh\necho "smi $*" >>"{self.log}"\n{body}\nexit {rc}\n')

    def nvcc(self, release):
        return write_exe(os.path.join(self.tmp, f"nvcc-{release}"), f"""#!/bin/sh
[ "$1" = --version ] || exit 1
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {release}, V{release}.88"
""")

    def torch_python(self, name, cuda="13.0", abi="True", avail="True", cap="9.0",
                     version="2.11.0+cu130", path=None):
        """A program that answers `-c CODE` like a Python with that torch: the probe (the code
        that prints cuda_available=) gets the key=value lines, `import torch` exits 0."""
        extra = f'echo "capability={cap}"\necho "device=NVIDIA H100 80GB HBM3"\n' \
            if avail == "True" else ""
        path = path or os.path.join(self.tmp, f"python-{name}")
        return write_exe(path, f"""#!/bin/sh
echo "torchpy $1" >>"{self.log}"
[ "$1" = -c ] || exit 96
case "$2" in *cuda_available*) ;; *) exit 0 ;; esac
echo "version={version}"
echo "cuda={cuda}"
echo "cxx11_abi={abi}"
echo "cmake_prefix_path={TORCH_CMAKE}"
echo "root={TORCH_ROOT}"
echo "cuda_available={avail}"
{extra}""")

    # ---- runners
    def env(self, **over):
        e = {k: v for k, v in os.environ.items() if k not in CLEARED}
        e.update(PATH=self.trap + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
                 LSPO_GPU_DRY_RUN="1", LSPO_CACHE_DIR=self.cache, LSPO_NVIDIA_SMI=self.gpu_smi,
                 LSPO_NVCC=self.nvcc13, LSPO_TORCH_PYTHON=self.torch, LSPO_BUILD_JOBS="2")
        for k, v in over.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return e

    def sh(self, script, **over):
        """Runs `script` in bash -euo pipefail after sourcing scripts/gpu_env.sh."""
        return subprocess.run(["bash", "-c", f"set -euo pipefail; . scripts/gpu_env.sh; {script}"],
                              cwd=REPO, env=self.env(**over), capture_output=True, text=True,
                              timeout=60)

    def quickstart(self, *args, **over):
        return subprocess.run([os.path.join(REPO, "scripts", "quickstart"), *args], cwd=REPO,
                              env=self.env(**over), capture_output=True, text=True, timeout=60)

    def calls(self):
        with open(self.log) as f:
            return f.read().splitlines()

    def assertNothingRan(self, r):
        """No pip, python3, cmake, ninja, apt-get, sudo or lspctl was called, and no build
        folder was made."""
        trapped = [c for c in self.calls() if c.startswith("TRAPPED")]
        self.assertEqual(trapped, [], r.stdout + r.stderr)
        self.assertEqual(os.path.exists(os.path.join(REPO, "build-cuda")), self.build_cuda_existed)

    @staticmethod
    def dry(r):
        """The commands of the dry run, each split as a shell would."""
        return [shlex.split(l[len("dry run: "):]) for l in r.stdout.splitlines()
                if l.startswith("dry run: ")]

    def configure_cmd(self, nvcc=None, arch="9.0", archs="90", build_dir="build-cuda"):
        return ["cmake", "-S", ".", "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_PREFIX_PATH={TORCH_ROOT};{TORCH_CMAKE}",
                f"-DCMAKE_CUDA_COMPILER={nvcc or self.nvcc13}",
                f"-DCMAKE_CUDA_ARCHITECTURES={archs}", f"-DTORCH_CUDA_ARCH_LIST={arch}"]

    # ---- lspo_gpu_detect
    def test_detect_names_the_gpu(self):
        r = self.sh('lspo_gpu_detect; echo "NAME=$LSPO_GPU_NAME"')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), [f"gpu: NVIDIA GPU: {H100}", f"NAME={H100}"])
        self.assertEqual(self.calls(), ["smi --query-gpu=name,memory.total --format=csv,noheader"])

    def test_detect_uses_device_0_of_several(self):
        smi = self.smi("two", f'printf "%s\\n%s\\n" "{H100}" "NVIDIA A100-SXM4-40GB, 40960 MiB"', 0)
        r = self.sh('lspo_gpu_detect quickstart; echo "NAME=$LSPO_GPU_NAME"', LSPO_NVIDIA_SMI=smi)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(),
                         [f"quickstart: NVIDIA GPU: {H100} (device 0 of 2)", f"NAME={H100}"])

    def test_detect_without_a_gpu_says_why(self):
        cases = {
            "nothing, exit 9": (self.smi("none", ":", 9), "nvidia-smi lists no GPU (exit 9)"),
            "the driver's error": (
                self.smi("nodriver", 'echo "NVIDIA-SMI has failed because it couldn\'t '
                         'communicate with the NVIDIA driver."', 9),
                "nvidia-smi lists no GPU (exit 9: NVIDIA-SMI has failed because it couldn't "
                "communicate with the NVIDIA driver.)"),
            "no nvidia-smi": (os.path.join(self.tmp, "absent", "nvidia-smi"),
                              "no nvidia-smi at " + os.path.join(self.tmp, "absent", "nvidia-smi")
                              + " (LSPO_NVIDIA_SMI)"),
        }
        for what, (smi, reason) in cases.items():
            with self.subTest(what):
                r = self.sh('if lspo_gpu_detect setup; then echo FOUND; else '
                            'echo "rc=$? NAME=[$LSPO_GPU_NAME] REASON=$LSPO_GPU_REASON"; fi',
                            LSPO_NVIDIA_SMI=smi)
                self.assertEqual(r.stdout.splitlines(),
                                 [f"setup: no NVIDIA GPU ({reason}): CPU build",
                                  f"rc=1 NAME=[] REASON={reason}"], r.stderr)

    def test_detect_with_no_nvidia_smi_on_path(self):
        r = self.sh('lspo_gpu_detect || echo "rc=$?"', LSPO_NVIDIA_SMI=None,
                    PATH=self.trap + os.pathsep + "/usr/bin:/bin")
        if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
            self.skipTest("this machine has nvidia-smi in /usr/bin")
        self.assertEqual(r.stdout.splitlines(),
                         ["gpu: no NVIDIA GPU (no nvidia-smi): CPU build", "rc=1"], r.stderr)

    def test_lspo_gpu_0_forces_the_cpu_path_without_asking_nvidia_smi(self):
        r = self.sh('lspo_gpu_detect || echo "rc=$? $LSPO_GPU_REASON"', LSPO_GPU="0")
        self.assertEqual(r.stdout.splitlines(),
                         ["gpu: no NVIDIA GPU (LSPO_GPU=0 asks for the CPU path): CPU build",
                          "rc=1 LSPO_GPU=0 asks for the CPU path"])
        self.assertEqual(self.calls(), [])

    # ---- lspo_gpu_torch_prepare
    PRINT = ('echo "PY=$LSPO_TORCH_PY VERSION=$LSPO_TORCH_VERSION CUDA=$LSPO_TORCH_CUDA '
             'PREFIXES=$LSPO_TORCH_PREFIXES ARCH=$LSPO_TORCH_ARCH ARCHS=$LSPO_CUDA_ARCHS '
             'NVCC=$LSPO_NVCC_PATH"')

    def test_prepare_with_a_cuda_torch(self):
        r = self.sh(f"lspo_gpu_torch_prepare; {self.PRINT}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.splitlines()[-1],
                         f"PY={self.torch} VERSION=2.11.0+cu130 CUDA=13.0 "
                         f"PREFIXES={TORCH_ROOT};{TORCH_CMAKE} ARCH=9.0 ARCHS=90 "
                         f"NVCC={self.nvcc13}")
        self.assertIn(f"gpu: torch 2.11.0+cu130 from {self.torch}: CUDA 13.0, C++11 ABI True, "
                      "torch.cuda.is_available() True, capability 9.0 (NVIDIA H100 80GB HBM3)",
                      r.stdout)
        self.assertIn(f"package root {TORCH_ROOT}; cmake prefix {TORCH_CMAKE}; nvcc 13.0", r.stdout)
        self.assertNothingRan(r)

    def test_prepare_refuses_what_cannot_be_used(self):
        cases = {
            "old ABI": (dict(torch=self.torch_python("abi", abi="False")),
                        "uses the pre-C++11 ABI (torch._C._GLIBCXX_USE_CXX11_ABI is False): it "
                        "cannot be linked with Debian's gRPC/Abseil/glog"),
            "CUDA unavailable": (dict(torch=self.torch_python("nocuda", avail="False")),
                                 "cannot use the GPU (torch.cuda.is_available() is False"),
            "CPU-only torch": (dict(torch=self.torch_python("cpu", cuda="", avail="False",
                                                            version="2.11.0+cpu")),
                               "torch 2.11.0+cpu"),
            "nvcc of another CUDA": (dict(nvcc=self.nvcc("12.8")),
                                     "built for CUDA 13.0 but nvcc"),
            "no nvcc": (dict(nvcc=os.path.join(self.tmp, "absent", "nvcc")), "no nvcc at "),
            "capability below 7.5": (dict(torch=self.torch_python("pascal", cap="6.1")),
                                     "compute capability 6.1 is below 7.5"),
            "torch not importable": (
                dict(torch=write_exe(os.path.join(self.tmp, "python-notorch"),
                                     "#!/bin/sh\necho \"ModuleNotFoundError: No module named "
                                     "'torch'\" >&2\nexit 1\n")),
                "cannot import torch with"),
            "LSPO_TORCH_PYTHON not a program": (
                dict(torch=os.path.join(self.tmp, "absent", "python")), "is not a program"),
        }
        for what, (fakes, reason) in cases.items():
            with self.subTest(what):
                r = self.sh('if lspo_gpu_torch_prepare; then echo PREPARED; else echo "rc=$? '
                            'PREFIXES=[$LSPO_TORCH_PREFIXES] REASON=$LSPO_GPU_REASON"; fi',
                            LSPO_TORCH_PYTHON=fakes.get("torch", self.torch),
                            LSPO_NVCC=fakes.get("nvcc", self.nvcc13))
                last = r.stdout.splitlines()[-1]
                self.assertTrue(last.startswith("rc=1 PREFIXES=[] REASON="), r.stdout + r.stderr)
                self.assertIn(reason, last)

    def test_the_probe_runs_on_a_real_python(self):
        # The probe's Python against a stub torch package with the attributes it reads.
        stub = os.path.join(self.tmp, "site")
        os.makedirs(os.path.join(stub, "torch"))
        with open(os.path.join(stub, "torch", "__init__.py"), "w") as f:
            f.write("""import os, types
__version__ = "2.11.0+cu130"
version = types.SimpleNamespace(cuda="13.0")
_C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
utils = types.SimpleNamespace(
    cmake_prefix_path=os.path.join(os.path.dirname(__file__), "share", "cmake"))
cuda = types.SimpleNamespace(is_available=lambda: True,
                             get_device_capability=lambda i=0: (9, 0),
                             get_device_name=lambda i=0: "NVIDIA H100 80GB HBM3")
""")
        root = os.path.join(stub, "torch")
        r = self.sh(f"lspo_gpu_torch_prepare; {self.PRINT}", LSPO_TORCH_PYTHON=sys.executable,
                    PYTHONPATH=stub)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"PREFIXES={root};{root}/share/cmake ARCH=9.0 ARCHS=90", r.stdout)

    def test_the_venv_is_made_on_demand_in_the_cache_root(self):
        venv = os.path.join(self.cache, "torch-cuda-venv")
        r = self.sh('lspo_gpu_torch_prepare || echo "rc=$? REASON=$LSPO_GPU_REASON"',
                    LSPO_TORCH_PYTHON=None)
        cmds = self.dry(r)
        self.assertIn(["python3", "-m", "venv", venv], cmds, r.stdout)
        self.assertIn([f"{venv}/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
                       "--progress-bar", "off", "torch==2.11.0"], cmds)
        self.assertIn(f"rc=1 REASON=dry run: {venv} was not made", r.stdout)
        self.assertFalse(os.path.exists(venv))
        self.assertNothingRan(r)

    def test_a_made_venv_is_used_and_a_stale_one_made_anew(self):
        venv = os.path.join(self.tmp, "venv")
        os.makedirs(os.path.join(venv, "bin"))
        open(os.path.join(venv, "pyvenv.cfg"), "w").close()
        py = self.torch_python("venv", path=os.path.join(venv, "bin", "python"))
        stamp = os.path.join(venv, ".lspo-stamp")
        with open(stamp, "w") as f:
            f.write("torch==2.11.0\n")
        r = self.sh(f"lspo_gpu_torch_prepare; {self.PRINT}", LSPO_TORCH_PYTHON=None,
                    LSPO_TORCH_VENV=venv)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"gpu: CUDA PyTorch environment present ({venv}, torch==2.11.0)", r.stdout)
        self.assertIn(f"PY={py} ", r.stdout)
        self.assertEqual(self.dry(r), [])
        with open(stamp, "w") as f:
            f.write("torch==2.10.0\n")
        r = self.sh("lspo_gpu_torch_prepare || true", LSPO_TORCH_PYTHON=None, LSPO_TORCH_VENV=venv)
        self.assertIn(["rm", "-rf", venv], self.dry(r))
        self.assertTrue(os.path.exists(py))  # dry run: nothing removed
        self.assertNothingRan(r)

    def test_no_venv_is_made_for_an_nvcc_the_pinned_wheel_does_not_match(self):
        r = self.sh('lspo_gpu_torch_prepare || echo "REASON=$LSPO_GPU_REASON"',
                    LSPO_TORCH_PYTHON=None, LSPO_NVCC=self.nvcc("12.8"))
        self.assertEqual(self.dry(r), [])
        self.assertIn("REASON=nvcc is CUDA 12.8 but the pinned torch==2.11.0 wheel is built for "
                      "CUDA 13", r.stdout)

    # ---- lspo_gpu_build
    def test_build_configures_build_cuda_as_docs_gpu_md_says(self):
        r = self.sh("lspo_gpu_torch_prepare >/dev/null; lspo_gpu_build")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(self.dry(r), [["rm", "-f", "build-cuda/CMakeCache.txt"],
                                       self.configure_cmd(),
                                       ["cmake", "--build", "build-cuda", "-j", "2", "--target",
                                        "lspctl"]])
        self.assertNothingRan(r)
        r = self.sh("lspo_gpu_torch_prepare >/dev/null; lspo_gpu_build lsp_gpu_worker lspctl",
                    LSPO_TORCH_PYTHON=self.torch_python("blackwell", cap="12.0"),
                    LSPO_GPU_BUILD_DIR=os.path.join(self.tmp, "bc"))
        cmds = self.dry(r)
        self.assertEqual(cmds[1], self.configure_cmd(arch="12.0", archs="120",
                                                     build_dir=os.path.join(self.tmp, "bc")))
        self.assertEqual(cmds[2][-2:], ["lsp_gpu_worker", "lspctl"])

    def test_build_needs_prepare_first(self):
        r = self.sh("lspo_gpu_build || echo rc=$?")
        self.assertIn("rc=2", r.stdout)
        self.assertIn("needs lspo_gpu_torch_prepare first", r.stderr)

    # ---- scripts/quickstart
    def test_quickstart_trains_on_the_gpu(self):
        r = self.quickstart("--steps=3")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "dry run: scripts/setup")
        head = (f"quickstart: training on the GPU: {H100} (LibTorch 2.11.0+cu130 from "
                f"{self.torch}, build-cuda/)")
        self.assertIn(head, lines)
        self.assertEqual(self.dry(r)[1:], [
            ["rm", "-f", "build-cuda/CMakeCache.txt"],
            self.configure_cmd(),
            ["cmake", "--build", "build-cuda", "-j", "2", "--target", "lspctl"],
            ["rm", "-rf", "runs/quickstart"],
            ["build-cuda/client/lspctl", "run", SPEC, OUT, "device=cuda", "--steps=3"]])
        configure = next(l for l in lines if "-B build-cuda" in l)
        self.assertLess(lines.index(head), lines.index(configure))
        self.assertNothingRan(r)

    def test_quickstart_leaves_a_device_the_caller_chose(self):
        r = self.quickstart("device=cpu")
        self.assertEqual(self.dry(r)[-1],
                         ["build-cuda/client/lspctl", "run", SPEC, OUT, "device=cpu"])

    def assertCpuPath(self, r, reason, args=()):
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"quickstart: training on the CPU ({reason})", r.stdout.splitlines())
        self.assertEqual(self.dry(r), [["scripts/setup"], ["scripts/build", "--target", "lspctl"],
                                       ["rm", "-rf", "runs/quickstart"],
                                       ["build/client/lspctl", "run", SPEC, OUT, *args]])
        self.assertNotIn("build-cuda", r.stdout)
        self.assertNothingRan(r)

    def test_quickstart_without_a_gpu_is_the_cpu_path_as_before(self):
        r = self.quickstart("--steps=3", LSPO_NVIDIA_SMI=self.smi("none", ":", 9))
        self.assertCpuPath(r, "nvidia-smi lists no GPU (exit 9)", ["--steps=3"])
        self.assertFalse(any(c.startswith("torchpy") for c in self.calls()))  # torch not asked

    def test_quickstart_with_lspo_gpu_0(self):
        self.assertCpuPath(self.quickstart(LSPO_GPU="0"), "LSPO_GPU=0 asks for the CPU path")
        self.assertEqual(self.calls(), [])

    def test_quickstart_falls_back_to_the_cpu_when_torch_cannot_be_used(self):
        cases = {
            "old ABI": (self.torch_python("abi", abi="False"), "uses the pre-C++11 ABI"),
            "CUDA unavailable": (self.torch_python("nocuda", avail="False"),
                                 "torch.cuda.is_available() is False"),
        }
        for what, (torch, reason) in cases.items():
            with self.subTest(what):
                r = self.quickstart(LSPO_TORCH_PYTHON=torch)
                line = next(l for l in r.stdout.splitlines()
                            if l.startswith("quickstart: training on the CPU ("))
                self.assertTrue(line.startswith(f"quickstart: training on the CPU ({H100} found, "
                                                f"but torch 2.11.0+cu130 ({torch})"), line)
                self.assertIn(reason, line)
                self.assertCpuPath(r, line[len("quickstart: training on the CPU ("):-1])

    def test_quickstart_with_lspo_gpu_1_fails_instead_of_falling_back(self):
        r = self.quickstart(LSPO_GPU="1", LSPO_TORCH_PYTHON=self.torch_python("abi", abi="False"))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("quickstart: LSPO_GPU=1 but the GPU cannot be used", r.stderr)
        self.assertEqual(self.dry(r), [["scripts/setup"]])

    # ---- scripts/setup's part
    def test_setup_on_a_cpu_machine_prints_one_line(self):
        r = self.sh("lspo_gpu_setup", LSPO_NVIDIA_SMI=self.smi("none", ":", 9))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(),
                         ["setup: no NVIDIA GPU (nvidia-smi lists no GPU (exit 9)): CPU build"])
        with open(os.path.join(REPO, "scripts", "setup")) as f:
            self.assertIn("\n. scripts/gpu_env.sh\nlspo_gpu_setup\n", f.read())

    def test_setup_with_lspo_gpu_1_fails_without_a_usable_gpu(self):
        r = self.sh("lspo_gpu_setup || echo rc=$?", LSPO_GPU="1",
                    LSPO_NVIDIA_SMI=self.smi("none", ":", 9))
        self.assertEqual(r.stdout.splitlines(),
                         ["setup: no NVIDIA GPU (nvidia-smi lists no GPU (exit 9)): CPU build",
                          "rc=1"])
        self.assertIn("LSPO_GPU=1 needs the GPU path", r.stderr)
        r = self.sh("lspo_gpu_setup || echo rc=$?", LSPO_GPU="1",
                    LSPO_TORCH_PYTHON=self.torch_python("nocuda", avail="False"))
        self.assertEqual(r.stdout.splitlines()[-1], "rc=1")

    def test_setup_with_a_gpu_makes_the_torch_venv(self):
        venv = os.path.join(self.cache, "torch-cuda-venv")
        r = self.sh("lspo_gpu_setup", LSPO_TORCH_PYTHON=None)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], f"setup: NVIDIA GPU: {H100}")
        self.assertIn(["python3", "-m", "venv", venv], self.dry(r))
        self.assertEqual(lines[-1], f"setup: the GPU cannot be used (dry run: {venv} was not "
                                    "made): CPU build")
        r = self.sh("lspo_gpu_setup")
        self.assertEqual(r.stdout.splitlines()[-1],
                         f"setup: GPU build ready: LibTorch 2.11.0+cu130 from {self.torch}, "
                         "TORCH_CUDA_ARCH_LIST=9.0 (scripts/quickstart builds build-cuda/)")
        self.assertNothingRan(r)


if __name__ == "__main__":
    unittest.main()
