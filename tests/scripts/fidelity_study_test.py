#!/usr/bin/env python3
"""Tests of scripts/fidelity_study.py: resume across machines (--resume-from), lr_of and
long_lrs runs, the early-stopping verdict and the source version it records per run. Standard
library unittest; run by CTest (tests/CMakeLists.txt)."""

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

    def test_a_zero_shot_measured_by_a_run_outside_only_is_reused(self):
        # --only cooking/lsp-best leaves cooking-native out of the plan's runs, but its imported
        # record measured cooking's zero-shot: the next cooking run need not measure it again.
        self.write_results([dict(record("cooking-native-s60-lr6e-4", loss=1.72),
                                 zero_shot_eval_loss=4.50),
                            record("sms-lsp-best-s60-lr6e-4", loss=0.06)])
        fs.import_records(self.out, self.results)
        self.assertTrue(fs.zero_shot_measured(self.out, "cooking"))
        self.assertFalse(fs.zero_shot_measured(self.out, "sms"))
        name = "sms-native-s60-lr1e-4"  # a run finished here: its summary.json counts
        os.makedirs(fs.run_dir(self.out, name))
        with open(os.path.join(fs.run_dir(self.out, name), "summary.json"), "w") as f:
            json.dump({"zero_shot_eval_loss": 8.0}, f)
        self.assertTrue(fs.zero_shot_measured(self.out, "sms"))

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


class BracketTest(unittest.TestCase):
    """The sweep runs outward from the middle lr and stops widening once three lrs have
    finished and the best one is bracketed."""

    MODE = {"name": "lora-r16", "mode": "lora", "lrs": [3e-4, 8e-4, 2e-3, 5e-3], "steps": [60]}

    def sweep_run(self, lr):
        return {"task": "sms", "mode": self.MODE, "steps": 60, "lr": lr, "sweep": True}

    def finished(self, losses):
        return [dict(record(f"r{lr}", loss=loss), mode_name="lora-r16", lr=lr, steps_budget=60)
                for lr, loss in losses.items()]

    def test_outward_order(self):
        self.assertEqual(fs.sweep_order([3e-4, 8e-4, 2e-3, 5e-3]), [8e-4, 5e-3, 3e-4])
        self.assertEqual(fs.sweep_order([1e-4, 2.5e-4, 6e-4]), [1e-4, 6e-4])
        plan = {"modes": [self.MODE], "order": [{"task": "sms", "phase": "sweep"}]}
        self.assertEqual([r["lr"] for r in fs.planned_runs(plan, [])], [8e-4, 5e-3, 3e-4])

    def test_an_outer_lr_runs_only_while_its_inner_neighbour_is_best(self):
        # Only the middle finished: both of its neighbours are needed.
        recs = self.finished({2e-3: 0.07})
        self.assertIsNone(fs.bracket_skip(recs, self.sweep_run(8e-4)))
        self.assertIsNone(fs.bracket_skip(recs, self.sweep_run(5e-3)))
        # 8e-4 beats the middle: the sweep goes on below (3e-4), not above (5e-3).
        recs = self.finished({2e-3: 0.07, 8e-4: 0.06})
        self.assertIsNone(fs.bracket_skip(recs, self.sweep_run(3e-4)))
        self.assertIn("2e-3, the neighbour toward the middle, is not it (the sweep goes on at 3e-4)",
                      fs.bracket_skip(recs, self.sweep_run(5e-3)))
        # 8e-4 best of three: the bracket is open below it, so 3e-4 runs.
        recs = self.finished({2e-3: 0.07, 8e-4: 0.06, 5e-3: 0.09})
        self.assertIsNone(fs.bracket_skip(recs, self.sweep_run(3e-4)))
        # 2e-3 best of three: 8e-4 and 5e-3 bracket it, 3e-4 is not needed.
        recs = self.finished({2e-3: 0.05, 8e-4: 0.06, 5e-3: 0.09})
        why = fs.bracket_skip(recs, self.sweep_run(3e-4))
        self.assertIn("2e-3 has the lowest eval loss of 3 finished lrs (0.0500)", why)
        # Not a sweep run (the middle lr, long runs): needed.
        self.assertIsNone(fs.bracket_skip(recs, dict(self.sweep_run(3e-4), sweep=False)))
        # An inner neighbour not finished: needed while that neighbour is, not needed once it
        # is left out.
        self.assertIsNone(fs.bracket_skip(self.finished({2e-3: 0.05, 5e-3: 0.06}),
                                          self.sweep_run(3e-4)))
        mode = dict(self.MODE, lrs=[3e-4, 8e-4, 2e-3, 5e-3, 1.2e-2])
        run = dict(self.sweep_run(1.2e-2), mode=mode)
        self.assertIsNone(fs.bracket_skip(self.finished({2e-3: 0.07, 8e-4: 0.08}), run))
        self.assertIn("8e-4 has the lowest eval loss",
                      fs.bracket_skip(self.finished({2e-3: 0.07, 8e-4: 0.06}), run))

    def test_three_lrs_even_when_the_best_is_at_the_grids_end(self):
        # A three-lr grid whose lowest lr wins: nothing lies below it, so the top lr still runs
        # (the minimum sweep is three lrs); with three finished, nothing more.
        mode = {"name": "lora-r16", "mode": "lora", "lrs": [1e-4, 2.5e-4, 6e-4], "steps": [60]}
        run = dict(self.sweep_run(6e-4), mode=mode)
        self.assertIsNone(fs.bracket_skip(self.finished({2.5e-4: 0.07, 1e-4: 0.05}), run))
        # Above the middle of a longer grid: 1e-2 is needed only while 5e-3 is the best.
        mode = dict(self.MODE, lrs=[3e-4, 8e-4, 2e-3, 5e-3, 1e-2])
        run = dict(self.sweep_run(1e-2), mode=mode)
        self.assertIsNone(fs.bracket_skip(self.finished({2e-3: 0.05, 8e-4: 0.06, 5e-3: 0.04}),
                                          run))
        self.assertIsNotNone(fs.bracket_skip(self.finished({2e-3: 0.05, 8e-4: 0.04, 5e-3: 0.06}),
                                             run))


class RecheckPlanTest(unittest.TestCase):
    """examples/fidelity/study/plan-recheck.yaml re-runs the SMS verdict's runs: each of its
    runs is a finished run of the full study (docs/fidelity/study-results.jsonl), at the lr
    the verdict compares (a mode's best final eval loss at 200 steps for native and lsp-best,
    at 60 steps for the baselines), and their measured wall times add up to under 90 minutes."""

    def test_recheck_runs_are_the_verdicts_and_fit_in_90_minutes(self):
        plan = fs.load_yaml(os.path.join(REPO, "examples/fidelity/study/plan-recheck.yaml"))
        fs.check_plan(plan)
        records = {r["name"]: r for r in fs.read_jsonl(
            os.path.join(REPO, "docs/fidelity/study-results.jsonl")) if r.get("status") == "done"}
        recs = list(records.values())
        total = 0.0
        for run in fs.planned_runs(plan, []):
            lr = run["lr"] if run["lr"] is not None else fs.choose_long_lr(
                [r for r in recs if r["mode_name"] != run["mode"]["name"]], "sms", run["mode"])
            name = fs.run_name("sms", run["mode"]["name"], run["steps"], lr)
            self.assertTrue(name in records, f"{name} of the recheck plan is not a run of the study")
            total += records[name]["process_seconds"] or records[name]["wall_seconds"]
        verdict = {"native": 200, "lsp-best": 200, "lora-r16": 60, "lora-r8": 60, "galore": 60}
        for m in plan["modes"]:
            best = fs.best_record(recs, "sms", m["name"], verdict[m["name"]])
            self.assertEqual(m["lrs"], [best["lr"]],
                             f"{m['name']}: the study's best lr at {verdict[m['name']]} steps is "
                             f"{best['lr']}")
        self.assertLess(total / 60, 90)


class LongLrsTest(unittest.TestCase):
    """`long_lrs` adds long runs at fixed lrs beside the one at the best 60-step lr; a fixed lr
    never stands in for the best-lr run, and one equal to the best lr is a single run."""

    PLAN = {"modes": [{"name": "native", "mode": "native", "lrs": [1e-4, 6e-4],
                       "steps": [60, 200], "long_lrs": [2.5e-4]}],
            "order": [{"task": "sms", "phase": "long"}]}

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def finish(self, name):
        os.makedirs(fs.run_dir(self.out, name))
        with open(os.path.join(fs.run_dir(self.out, name), "summary.json"), "w") as f:
            json.dump({}, f)

    def test_a_fixed_long_lr_is_a_run_of_its_own(self):
        runs = fs.planned_runs(self.PLAN, [])
        self.assertEqual([(r["steps"], r["lr"]) for r in runs], [(200, None), (200, 2.5e-4)])
        self.finish("sms-native-s200-lr2.5e-4")
        # The fixed-lr run is not taken for the best-lr one (which is still to do)...
        self.assertIsNone(fs.find_long_run(self.out, "sms", "native", 200, [2.5e-4]))
        # ...while a long run at another lr is.
        self.finish("sms-native-s200-lr6e-4")
        self.assertEqual(fs.find_long_run(self.out, "sms", "native", 200, [2.5e-4]),
                         "sms-native-s200-lr6e-4")

    def test_long_lrs_per_task(self):
        # A mapping gives the fixed long lrs of the tasks it names; other tasks get none.
        plan = {"modes": [{"name": "native", "mode": "native", "lrs": [1e-4, 6e-4],
                           "steps": [60, 200], "long_lrs": {"sms": [2.5e-4]}}],
                "order": [{"task": "sms", "phase": "long"}, {"task": "cooking", "phase": "long"}]}
        runs = fs.planned_runs(plan, [])
        self.assertEqual([(r["task"], r["steps"], r["lr"]) for r in runs],
                         [("sms", 200, None), ("sms", 200, 2.5e-4), ("cooking", 200, None)])
        self.assertEqual(fs.long_lrs_of(plan["modes"][0], "cooking"), [])
        self.assertEqual(fs.long_lrs_of(self.PLAN["modes"][0], "cooking"), [2.5e-4])
        # On cooking a finished long run at 2.5e-4 is the best-lr run (no fixed lr there).
        self.finish("cooking-native-s200-lr2.5e-4")
        self.assertEqual(fs.find_long_run(self.out, "cooking", "native", 200,
                                          fs.long_lrs_of(plan["modes"][0], "cooking")),
                         "cooking-native-s200-lr2.5e-4")
        plan["tasks"] = {"sms": {"spec": "x.yaml", "metric": "accuracy"}}
        plan["order"] = plan["order"][:1]
        fs.check_plan(plan)
        plan["modes"][0]["long_lrs"] = {"smss": [2.5e-4]}
        with self.assertRaises(SystemExit) as e:
            fs.check_plan(plan)
        self.assertIn("long_lrs names unknown task(s) smss (tasks: sms)", str(e.exception))
        plan["modes"][0]["long_lrs"] = {"sms": 2.5e-4}
        with self.assertRaises(SystemExit) as e:
            fs.check_plan(plan)
        self.assertIn("long_lrs maps each task to a list", str(e.exception))

    def test_bad_long_lrs_are_refused_by_name(self):
        plan = {"tasks": {"sms": {"spec": "x.yaml", "metric": "accuracy"}},
                "order": [{"task": "sms", "phase": "long"}],
                "modes": [{"name": "lora", "mode": "lora", "lrs": [1e-3], "steps": [60],
                           "long_lrs": [3e-4]}]}
        with self.assertRaises(SystemExit) as e:
            fs.check_plan(plan)
        self.assertIn("mode lora has long_lrs but no step budget above 60", str(e.exception))
        plan["modes"][0].update(steps=[60, 200], long_lrs=["3e-4"])
        with self.assertRaises(SystemExit) as e:
            fs.check_plan(plan)
        self.assertIn("every lr must be a number", str(e.exception))


class EarlyStoppingTest(unittest.TestCase):
    """The verdict's early-stopping lines compare each mode's lowest-loss evaluation after step 0
    over all its runs at the budget, with the step and lr it came from."""

    def test_best_evaluation_over_runs_and_steps(self):
        def rec(mode, lr, curve):
            return {"task": "sms", "mode_name": mode, "steps_budget": 200, "lr": lr,
                    "curve": [{"step": s, "loss": l, "accuracy": a} for s, l, a in curve]}
        recs = [rec("native", 6e-4, [(0, 8.0, 0.0), (100, 0.028, 0.975), (200, 0.095, 0.947)]),
                rec("lsp", 6e-4, [(0, 8.0, 0.0), (100, 0.0284, 0.977), (200, 0.27, 0.887)]),
                rec("lsp", 3e-4, [(100, 0.05, 0.96), (200, 0.04, 0.955)])]
        r, p = fs.best_evaluation(recs, "sms", "lsp", 200)
        self.assertEqual((r["lr"], p["step"], p["loss"]), (6e-4, 100, 0.0284))
        v = {"max_metric_drop": 0.01, "max_loss_ratio": 1.05}
        lines = fs.early_stopping_lines(recs, "sms", "native", "lsp", 200, "accuracy", "accuracy", v)
        self.assertEqual(len(lines), 2)
        self.assertIn("PASS: 0.977 (lr 6e-4, step 100) vs 0.975 (lr 6e-4, step 100), +0.2 points",
                      lines[0])
        self.assertIn("eval loss: PASS: 0.0284 vs 0.0280, +1.4%", lines[1])
        self.assertIsNone(fs.best_evaluation(recs, "sms", "lora", 200))


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
