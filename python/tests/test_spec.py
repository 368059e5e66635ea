"""lspo.spec: the two spec readers (this package's and lspctl's) and the spec forms."""
import glob
import json
import os
import pathlib
import unittest

import grpc

import lspo
from lspo._proto import job_spec_pb2
from lspo.spec import parse_spec_with_lspctl, spec_file
from support import LSPCTL, REPO, TINY_JOB

HAVE_LSPCTL = os.access(LSPCTL, os.X_OK)
TINY = os.path.join(REPO, TINY_JOB)


class PythonReaderTest(unittest.TestCase):
    def test_yaml_file_with_short_and_full_enum_names(self):
        spec = lspo.parse_spec(TINY)
        self.assertEqual(spec.name, "tiny-moby-dick")
        self.assertEqual(spec.mode, job_spec_pb2.MODE_LSP)  # MODE_LSP in the file
        self.assertEqual(spec.model.format, job_spec_pb2.MODEL_FORMAT_TINY_RANDOM)  # tiny-random
        self.assertAlmostEqual(spec.optim.lr, 0.05)
        self.assertEqual((spec.steps, spec.lsp.d, spec.lsp.r), (20, 16, 4))
        short = lspo.parse_spec({"mode": "lsp", "model": {"format": "Tiny_Random"},
                                 "schedule": "serial"})
        full = lspo.parse_spec({"mode": "MODE_LSP", "model": {"format": "MODEL_FORMAT_TINY_RANDOM"},
                                "schedule": "STEP_SCHEDULE_SERIAL"})
        self.assertEqual(short, full)

    def test_forms_of_a_spec_agree(self):
        from_path = lspo.parse_spec(TINY)
        text = pathlib.Path(TINY).read_text()
        self.assertEqual(lspo.parse_spec(pathlib.Path(TINY)), from_path)
        self.assertEqual(lspo.parse_spec(text), from_path)
        as_json = json.dumps(lspo.spec.spec_tree(TINY))
        self.assertEqual(lspo.parse_spec(as_json), from_path)
        self.assertEqual(lspo.parse_spec(from_path), from_path)
        self.assertEqual(lspo.load_spec(from_path), from_path)  # a JobSpec goes as it is
        self.assertEqual(lspo.parse_spec({"microBatchSize": 4}).micro_batch_size, 4)

    def test_overrides_of_field_paths(self):
        spec = lspo.parse_spec(TINY, ["steps=3", "optim.lr=1e-3", "lsp.d=8", "name=x"])
        self.assertEqual((spec.steps, spec.lsp.d, spec.name), (3, 8, "x"))
        self.assertAlmostEqual(spec.optim.lr, 1e-3)
        spec = lspo.parse_spec({"epochs": 2}, {"steps": 5, "data.train_path": "a.jsonl"})
        self.assertEqual((spec.steps, spec.epochs, spec.data.train_path), (5, 0, "a.jsonl"))

    def test_aliases_and_unknown_keys_are_named(self):
        with self.assertRaises(lspo.LspoError) as e:
            lspo.parse_spec({"learning_rate": 1e-3, "optim": {"lrr": 1}, "steps": 2})
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("2 unknown fields: 'learning_rate', 'optim.lrr'", e.exception.message)
        self.assertIn("lspctl", e.exception.message)

    def test_bad_input(self):
        for spec, words in [({"steps": "many"}, "steps"),
                            ({"mode": "fastest"}, "mode"),
                            ("no-such-spec.yaml", "no-such-spec.yaml"),
                            ("name: [unclosed\n", "not valid YAML"),
                            ("- a list\n", "mapping at the top level")]:
            with self.assertRaises(lspo.LspoError, msg=spec) as e:
                lspo.parse_spec(spec)
            self.assertIn(words, e.exception.message)
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(lspo.LspoError):
            lspo.parse_spec({}, ["no-equals-sign"])
        with self.assertRaises(ValueError):
            lspo.load_spec({}, reader="other")

    def test_spec_file_for_lspctl(self):
        with spec_file(TINY) as path:
            self.assertEqual(path, TINY)
        with spec_file({"steps": 2}) as path:
            self.assertTrue(path.endswith(".json"))
            with open(path) as f:
                self.assertEqual(json.load(f), {"steps": 2})
        self.assertFalse(os.path.exists(path))
        with spec_file("steps: 2\n") as path:
            self.assertTrue(path.endswith(".yaml"))


@unittest.skipUnless(HAVE_LSPCTL, f"{LSPCTL} is not built")
class LspctlReaderTest(unittest.TestCase):
    def test_every_example_reads_the_same_in_both_readers(self):
        examples = sorted(glob.glob(os.path.join(REPO, "examples", "*.yaml")))
        self.assertGreaterEqual(len(examples), 5)
        for path in examples:
            with self.subTest(example=os.path.basename(path)):
                self.assertEqual(parse_spec_with_lspctl(path, lspctl=LSPCTL),
                                 lspo.parse_spec(path))

    def test_aliases_and_overrides_as_lspctl_reads_them(self):
        spec = lspo.load_spec({"learning_rate": 2e-3, "max_steps": 7, "name": "a"},
                              ["gradient_accumulation_steps=2"], reader="lspctl", lspctl=LSPCTL)
        self.assertAlmostEqual(spec.optim.lr, 2e-3)
        self.assertEqual((spec.steps, spec.grad_accum, spec.name), (7, 2, "a"))
        auto = lspo.load_spec({"max_steps": 7}, lspctl=LSPCTL)  # auto: lspctl found
        self.assertEqual(auto.steps, 7)

    def test_lspctl_messages_name_the_problem(self):
        with self.assertRaises(lspo.LspoError) as e:
            lspo.load_spec({"optim": {"lrr": 1}}, reader="lspctl", lspctl=LSPCTL)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("did you mean optim.lr?", e.exception.message)
        self.assertIn("<the given spec>", e.exception.message)  # not the temporary file
        with self.assertRaises(lspo.LspoError) as e:
            lspo.load_spec({"learning_rate": 1e-3, "optim": {"lr": 3e-4}}, reader="lspctl",
                           lspctl=LSPCTL)
        self.assertIn("learning_rate", e.exception.message)


if __name__ == "__main__":
    unittest.main()
