"""The installed package: where it came from, its generated stubs, types and documentation."""
import inspect
import os
import unittest

import lspo
from lspo._proto import scheduler_pb2


class PackageTest(unittest.TestCase):
    def test_imported_from_the_pip_install(self):
        where = os.environ.get("LSPO_INSTALLED_AT")
        if not where:
            self.skipTest("not run by python/tests/run_tests")
        self.assertTrue(os.path.realpath(lspo.__file__).startswith(os.path.realpath(where)),
                        lspo.__file__)

    def test_stubs_generated_with_types_and_marker(self):
        pkg = os.path.dirname(lspo.__file__)
        self.assertTrue(os.path.exists(os.path.join(pkg, "py.typed")))
        gen = os.path.join(pkg, "_gen", "proto")
        for name in ("job_spec_pb2.py", "job_spec_pb2.pyi", "metrics_pb2.py",
                     "scheduler_pb2.py", "scheduler_pb2.pyi", "scheduler_pb2_grpc.py"):
            self.assertTrue(os.path.exists(os.path.join(gen, name)), name)
        with open(os.path.join(gen, "scheduler_pb2_grpc.py")) as f:
            text = f.read()
        self.assertIn("from lspo._gen.proto import scheduler_pb2", text)
        self.assertNotIn("from proto import", text)

    def test_job_state_is_the_protos(self):
        proto = {v.name: v.number for v in scheduler_pb2.JobState.DESCRIPTOR.values}
        self.assertEqual(proto, {s.name: s.value for s in lspo.JobState})
        self.assertTrue(lspo.JobState.CANCELLED.finished)
        self.assertFalse(lspo.JobState.RUNNING.finished)

    def test_every_public_name_is_documented_and_typed(self):
        for name in lspo.__all__:
            obj = getattr(lspo, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            with self.subTest(name=name):
                self.assertTrue(inspect.getdoc(obj), f"{name} has no docstring")
                members = [obj] if inspect.isfunction(obj) else [
                    m for k, m in vars(obj).items()
                    if inspect.isfunction(m) and not k.startswith("_")]
                for f in members:
                    self.assertTrue(inspect.getdoc(f), f"{name}.{f.__name__}: no docstring")
                    sig = inspect.signature(f)
                    self.assertIsNot(sig.return_annotation, inspect.Signature.empty,
                                     f"{name}.{f.__name__}: no return type")

    def test_modules_stay_small(self):
        pkg = os.path.dirname(lspo.__file__)
        for f in os.listdir(pkg):
            if f.endswith(".py"):
                with open(os.path.join(pkg, f)) as fh:
                    self.assertLess(len(fh.readlines()), 700, f)


if __name__ == "__main__":
    unittest.main()
