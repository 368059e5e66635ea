#!/usr/bin/env python3
"""Tests of scripts/fidelity_study.py's resume across machines (--resume-from) and the source
version it records per run. Standard library unittest; run by CTest (tests/CMakeLists.txt)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import fidelity_study as fs  # noqa: E402


def record(name, status="done", loss=0.5):
    """A results.jsonl line as collect_record writes it (the fields the tests read)."""
    return {"name": name, "task": "sms", "mode_name": "native", "steps": 60, "lr": 1e-4,
            "final_eval_loss": loss, "status": status}


class ResumeFromTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.tmp.name, "out")
        self.results = os.path.join(self.tmp.name, "results.jsonl")

    def tearDown(self):
        self.tmp.cleanup()

    def write_results(self, rows):
        with open(self.results, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    def test_finished_runs_count_as_done_with_their_records(self):
        self.write_results([record("sms-native-s60-lr1e-4", loss=0.073),
                            record("sms-native-s60-lr6e-4", status="failed")])
        self.assertEqual(fs.import_records(self.out, self.results), 1)
        self.assertTrue(fs.is_done(self.out, "sms-native-s60-lr1e-4"))
        self.assertFalse(fs.is_done(self.out, "sms-native-s60-lr6e-4"))  # a failure is retried
        run = {"name": "sms-native-s60-lr1e-4", "task": "sms", "mode": {"name": "native"}}
        rec = fs.collect_record(self.out, run, "accuracy")
        self.assertEqual(rec["final_eval_loss"], 0.073)
        self.assertEqual(rec["status"], "done")
        # A second import changes nothing (the run is done here now).
        self.assertEqual(fs.import_records(self.out, self.results), 0)

    def test_a_run_finished_here_wins_over_an_imported_record(self):
        name = "sms-native-s60-lr1e-4"
        os.makedirs(fs.run_dir(self.out, name))
        with open(os.path.join(fs.run_dir(self.out, name), "summary.json"), "w") as f:
            json.dump({"mode": "native", "steps": 60, "lr": 1e-4, "final_eval_loss": 0.2}, f)
        self.write_results([record(name, loss=0.9)])
        self.assertEqual(fs.import_records(self.out, self.results), 0)
        run = {"name": name, "task": "sms", "mode": {"name": "native"}}
        self.assertEqual(fs.collect_record(self.out, run, "accuracy")["final_eval_loss"], 0.2)

    def test_bad_files_are_refused_by_name(self):
        with self.assertRaises(SystemExit) as e:
            fs.import_records(self.out, os.path.join(self.tmp.name, "missing.jsonl"))
        self.assertIn("missing.jsonl: no such file", str(e.exception))
        self.write_results([{"status": "done"}])
        with self.assertRaises(SystemExit) as e:
            fs.import_records(self.out, self.results)
        self.assertIn("a line without a run name", str(e.exception))


class LrOfTest(unittest.TestCase):
    """A mode with lr_of (e.g. lsp-best-refit) has only long runs, at the other mode's best
    60-step lr (lowest final eval loss), or its own lrs' middle value before that exists."""

    PLAN = {"modes": [{"name": "lsp-best", "mode": "lsp", "lrs": [3e-4, 6e-4, 1.2e-3],
                       "steps": [60, 200]},
                      {"name": "lsp-best-refit", "mode": "lsp", "lr_of": "lsp-best",
                       "lrs": [6e-4], "steps": [200]}],
            "order": [{"task": "sms", "phase": "middle"}, {"task": "sms", "phase": "sweep"},
                      {"task": "sms", "phase": "long"}]}

    def test_only_long_runs_at_the_other_modes_best_lr(self):
        runs = fs.planned_runs(self.PLAN, [])
        refit = [r for r in runs if r["mode"]["name"] == "lsp-best-refit"]
        self.assertEqual([(r["steps"], r["lr"]) for r in refit], [(200, None)])
        self.assertEqual(len([r for r in runs if r["mode"]["name"] == "lsp-best"]), 4)
        mode = self.PLAN["modes"][1]
        self.assertEqual(fs.choose_long_lr([], "sms", mode), 6e-4)
        recs = [dict(record("a", loss=0.09), mode_name="lsp-best", lr=3e-4, steps_budget=60),
                dict(record("b", loss=0.07), mode_name="lsp-best", lr=1.2e-3, steps_budget=60)]
        self.assertEqual(fs.choose_long_lr(recs, "sms", mode), 1.2e-3)


class SourceVersionTest(unittest.TestCase):
    def test_names_the_checked_out_commit(self):
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                              capture_output=True, text=True)
        if head.returncode != 0:
            self.skipTest("not a git checkout")
        version = fs.source_version()
        self.assertTrue(version.startswith(head.stdout.strip()), version)
        self.assertIn(version[len(head.stdout.strip()):], ("", "+changes"))


if __name__ == "__main__":
    unittest.main()
