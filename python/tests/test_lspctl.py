"""lspo.plan and lspo.run (lspctl plan / lspctl run as subprocesses) and find_lspctl."""
import io
import os
import shutil
import stat
import tempfile
import unittest
from unittest import mock

import lspo
from lspo.lspctl import parse_plan
from support import LSPCTL, MAIN_JOB, MODEL, REPO, TINY_JOB, tiny_spec

HAVE_LSPCTL = os.access(LSPCTL, os.X_OK)


class FindLspctlTest(unittest.TestCase):
    def test_argument_then_environment_then_path(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        exe = os.path.join(tmp, "lspctl")
        with open(exe, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(exe, stat.S_IRWXU)
        self.assertEqual(lspo.find_lspctl(exe), exe)
        with mock.patch.dict(os.environ, {"LSPO_LSPCTL": exe}):
            self.assertEqual(lspo.find_lspctl(), exe)
        env = {k: v for k, v in os.environ.items() if k != "LSPO_LSPCTL"}
        env["PATH"] = tmp
        with mock.patch.dict(os.environ, env, clear=True):
            self.assertEqual(lspo.find_lspctl(), exe)
        with self.assertRaises(lspo.LspoError) as e:
            lspo.find_lspctl(os.path.join(tmp, "missing"))
        self.assertIn("not an executable file", e.exception.message)

    def test_nothing_found_says_how_to_give_it(self):
        env = {"PATH": "/nonexistent"}
        cwd = os.getcwd()
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        os.chdir(tmp)
        self.addCleanup(os.chdir, cwd)
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("lspo.lspctl.__file__", os.path.join(tmp, "lspctl.py")):
            self.assertIsNone(lspo.find_lspctl(required=False))
            with self.assertRaises(lspo.LspoError) as e:
                lspo.find_lspctl()
        self.assertIn("LSPO_LSPCTL", e.exception.message)


# `lspctl plan --spec=examples/smollm2-sms-spam.yaml --device=cuda --device_memory_gb=4`, cut.
PLAN_TEXT = """\
memory plan of models/SmolLM2-135M-Instruct.Q4_1.gguf (30 layers, hidden 576)
micro-batch 8 x seq_len 128 = 1024 tokens; * = the job's mode
MiB                                           lsp *            zero          native
worker, GPU memory
  trained weights (bf16)                      202.5           202.5           202.5
  projectors P, Q (r = 4)                      13.6               -               -
  peak: static + max(activations + workspace, (+)) + margin           1912.7          1845.1          2263.3
optimizer service (host)
  total                                       693.5          2347.1               -
moved per step, worker -> optimizer            60.1           202.5               -

on a 1.20 GiB GPU (0.70 GiB for LibTorch's allocator after 0.50 GiB of CUDA context):
  lsp *           does not fit: peak 1.87 GiB; only with activation checkpointing
  zero            fits: peak 1.80 GiB; largest micro-batch 1 at seq_len 128
"""


class PlanTest(unittest.TestCase):
    def test_parse_plan(self):
        p = parse_plan(PLAN_TEXT)
        self.assertEqual(p.modes, ["lsp", "zero", "native"])
        self.assertEqual(p.job_mode, "lsp")
        self.assertEqual(p.peak_mib(), 1912.7)
        self.assertEqual(p.peak_mib("native"), 2263.3)
        rows = {(r.section, r.label): r.mib for r in p.rows}
        self.assertEqual(rows[("worker, GPU memory", "projectors P, Q (r = 4)")],
                         {"lsp": 13.6, "zero": None, "native": None})
        self.assertEqual(rows[("optimizer service (host)", "total")]["zero"], 2347.1)
        self.assertEqual(rows[("", "moved per step, worker -> optimizer")]["lsp"], 60.1)
        self.assertEqual(p.fits, {"lsp": False, "zero": True})
        self.assertEqual(p.verdicts["zero"], "fits: peak 1.80 GiB; largest micro-batch 1 at "
                         "seq_len 128")

    @unittest.skipUnless(HAVE_LSPCTL and os.path.exists(MODEL), "needs lspctl and the model")
    def test_plan_of_the_main_job(self):
        p = lspo.plan(MAIN_JOB, device="cuda", device_memory_gb=4, lspctl=LSPCTL, cwd=REPO)
        self.assertIn("memory plan of models/SmolLM2-135M-Instruct.Q4_1.gguf", p.text)
        self.assertEqual(p.job_mode, "lsp")
        self.assertIn("native", p.modes)
        self.assertTrue(p.fits["lsp"])  # README: fits a 4 GB card
        self.assertGreater(p.peak_mib(), 1000)
        self.assertLess(p.peak_mib(), 4096)
        cut = lspo.plan(MAIN_JOB, overrides=["micro_batch_size=1"], device="cuda",
                        lspctl=LSPCTL, cwd=REPO)
        self.assertLess(cut.peak_mib(), p.peak_mib())
        self.assertEqual(cut.fits, {})

    @unittest.skipUnless(HAVE_LSPCTL, "needs lspctl")
    def test_plan_of_a_bad_spec(self):
        with self.assertRaises(lspo.LspoError) as e:
            lspo.plan({"optim": {"lrr": 1}}, lspctl=LSPCTL)
        self.assertIn("did you mean optim.lr?", e.exception.message)


@unittest.skipUnless(HAVE_LSPCTL and os.path.exists(MODEL), "needs lspctl and the model")
class RunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lspo-run-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_embedded_run_of_the_smoke_job(self):
        out = os.path.join(self.tmp, "out")
        echo = io.StringIO()
        r = lspo.run(TINY_JOB, steps=3, output_dir=out, lspctl=LSPCTL, cwd=REPO, echo=echo)
        self.assertEqual((r.state, r.returncode, r.output_dir), ("SUCCEEDED", 0, out))
        self.assertTrue(r.job_id.startswith("job-"))
        self.assertIn("step 3/3", r.output)
        self.assertEqual(echo.getvalue(), r.output)
        for f in ("config.json", "model.safetensors", "summary.json", "metrics.jsonl"):
            self.assertTrue(os.path.exists(os.path.join(out, f)), f)

    def test_failed_run_raises_with_lspctl_message(self):
        spec = tiny_spec(os.path.join(self.tmp, "out"))
        spec["data"]["train_path"] = os.path.join(self.tmp, "missing.txt")
        with self.assertRaises(lspo.LspoError) as e:
            lspo.run(spec, lspctl=LSPCTL, cwd=REPO)
        self.assertIn("missing.txt", e.exception.message)
        r = lspo.run(spec, lspctl=LSPCTL, cwd=REPO, check=False)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    unittest.main()
