"""The client against real services: lsp_gpu_worker, lsp_cpu_optimizer and lsp_scheduler from
the CMake build, started by this test on free loopback ports (support.Services)."""
import os
import shutil
import subprocess
import tempfile
import unittest

import grpc

import lspo
from lspo.client import _is_loopback
from support import (MODEL, REPO, TINY_JOB, Services, free_port, missing_binaries,
                     tiny_spec)

SERVICES = None


def setUpModule():  # noqa: N802 (unittest's name)
    global SERVICES
    os.chdir(REPO)  # relative spec paths: the scheduler runs from here too
    missing = missing_binaries()
    if missing:
        raise unittest.SkipTest(f"not built: {', '.join(missing)} (scripts/build)")
    SERVICES = Services()


def tearDownModule():  # noqa: N802
    if SERVICES is not None:
        SERVICES.stop()


def _files(folder):
    return set(os.listdir(folder)) if os.path.isdir(folder) else set()


class NotebookTest(unittest.TestCase):
    """Issue 45's target: ten lines of a notebook submit the main job to a running scheduler,
    watch it and get the output folder."""

    @unittest.skipUnless(os.path.exists(MODEL), "no model: scripts/setup fetches it")
    def test_ten_lines_submit_the_main_job_watch_it_and_get_the_output_folder(self):
        os.chdir(REPO)  # the spec's relative paths: the scheduler runs from here too
        seen = []
        # ---- the notebook (the job cut to one step, 8 evaluation messages, 2 fit iterations)
        import lspo
        client = lspo.Client(SERVICES.address)
        job = client.submit("examples/smollm2-sms-spam.yaml",
                            overrides=["max_steps=1", "data.max_eval_examples=8",
                                       "lsp.fit_iters=2"])
        for status in job.watch():
            print(lspo.progress_line(status))
            seen.append(status)
        final = job.wait()
        out = job.output_dir
        # ---- checks
        self.assertEqual(final.state, lspo.JobState.SUCCEEDED,
                         f"{final.error}\n{SERVICES.log_tail('scheduler')}")
        self.assertEqual(final.spec.name, "smollm2-sms-spam")
        self.assertEqual(final.spec.steps, 1)
        self.assertEqual(final.step, 1)
        self.assertTrue(out.startswith(SERVICES.runs), out)  # the scheduler's --runs_root
        for f in ("config.json", "model.safetensors", "tokenizer.json", "summary.json",
                  "metrics.jsonl", "report.html"):
            self.assertIn(f, _files(out))
        self.assertTrue(any(s.HasField("last_step") for s in seen))
        self.assertEqual(len(final.evals), 2)  # zero-shot and after the step
        self.assertEqual(seen[-1].state, lspo.JobState.SUCCEEDED)
        self.assertIn(f"{job.job_id}: SUCCEEDED step 1/1 loss ", lspo.progress_line(final))
        self.assertIn(job.job_id, [s.job_id for s in client.list()])
        client.close()


class JobsTest(unittest.TestCase):
    def setUp(self):
        self.client = lspo.Client(SERVICES.address, timeout=30)
        self.out = tempfile.mkdtemp(prefix="lspo-out-", dir=SERVICES.tmp)

    def tearDown(self):
        self.client.close()

    def test_dict_spec_read_by_python_runs_to_success(self):
        client = lspo.Client(SERVICES.address, spec_reader="python")
        job = client.submit(tiny_spec(self.out, steps=3))
        final = job.wait(check=True)
        self.assertEqual(final.state, lspo.JobState.SUCCEEDED)
        self.assertEqual(final.output_dir, self.out)
        self.assertTrue({"config.json", "model.safetensors", "summary.json"} <= _files(self.out))
        # A finished job's watch replays its steps (RUNNING), then its final status.
        again = list(client.watch(job.job_id))
        self.assertEqual([s.state for s in again], [lspo.JobState.RUNNING] * 2 +
                         [lspo.JobState.SUCCEEDED])
        self.assertEqual([s.last_step.step for s in again], [1, 2, 3])
        self.assertEqual(job.state, lspo.JobState.SUCCEEDED)
        client.close()

    def test_spec_file_with_overrides_and_output_dir(self):
        job = self.client.submit(TINY_JOB, overrides={"max_steps": 2, "optim.lr": 0.01},
                                 output_dir=self.out)
        final = job.wait(timeout=120, check=True)
        self.assertEqual((final.spec.steps, final.step, final.output_dir), (2, 2, self.out))
        self.assertAlmostEqual(final.spec.optim.lr, 0.01)
        self.assertIn("model.safetensors", _files(self.out))

    def test_cancel_a_running_and_a_queued_job(self):
        running = self.client.submit(tiny_spec(os.path.join(self.out, "a"), steps=100000))
        for status in running.watch(timeout=120):
            if status.step >= 1:
                break
        self.assertEqual(running.status().state, lspo.JobState.RUNNING)
        # The scheduler runs one job at a time: the next one waits in the queue.
        queued = self.client.submit(tiny_spec(os.path.join(self.out, "b"), steps=3))
        self.assertEqual(queued.status().state, lspo.JobState.QUEUED)
        self.assertEqual(queued.cancel(), lspo.JobState.CANCELLED)  # at once
        self.assertIn(self.client.cancel(running.job_id),
                      (lspo.JobState.RUNNING, lspo.JobState.CHECKPOINTING))
        final = running.wait(timeout=120)
        self.assertEqual(final.state, lspo.JobState.CANCELLED)
        self.assertLess(final.step, 100000)
        with self.assertRaises(lspo.JobFailedError) as e:
            running.wait(check=True)
        self.assertEqual(e.exception.state, "CANCELLED")
        # An ended job is left as it was.
        self.assertEqual(running.cancel(), lspo.JobState.CANCELLED)
        states = {s.job_id: s.state for s in self.client.list()}
        self.assertEqual(states[running.job_id], lspo.JobState.CANCELLED)
        self.assertEqual(states[queued.job_id], lspo.JobState.CANCELLED)

    def test_unknown_job_is_not_found(self):
        for call in (lambda: self.client.status("job-0-0"),
                     lambda: self.client.cancel("job-0-0"),
                     lambda: list(self.client.watch("job-0-0"))):
            with self.assertRaises(lspo.LspoError) as e:
                call()
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("job-0-0", e.exception.message)

    def test_spec_the_scheduler_refuses(self):
        spec = tiny_spec(self.out)
        spec["data"]["train_path"] = os.path.join(self.out, "no-such-file.txt")
        with self.assertRaises(lspo.LspoError) as e:
            self.client.submit(spec)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("no-such-file.txt", e.exception.message)
        spec = tiny_spec(self.out)
        spec["lsp"]["r"] = 99  # r <= d
        with self.assertRaises(lspo.LspoError) as e:
            self.client.submit(spec)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("lsp.r", e.exception.message)

    def test_no_scheduler_is_unavailable(self):
        with lspo.Client(f"127.0.0.1:{free_port()}", timeout=2) as client:
            with self.assertRaises(lspo.LspoError) as e:
                client.list()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)


class TokenTest(unittest.TestCase):
    """A scheduler with --auth_token_file (no peers needed to list jobs)."""

    TOKEN = "0123456789abcdef0123456789abcdef"

    @classmethod
    def setUpClass(cls):
        fd, cls.token_file = tempfile.mkstemp(prefix="lspo-token-")
        os.write(fd, (cls.TOKEN + "\n").encode())
        os.close(fd)
        os.chmod(cls.token_file, 0o600)
        cls.services = Services([f"--auth_token_file={cls.token_file}"], peers=False)

    @classmethod
    def tearDownClass(cls):
        cls.services.stop()
        os.unlink(cls.token_file)

    def test_right_token_is_served(self):
        with lspo.Client(self.services.address, token=self.TOKEN) as client:
            self.assertEqual(client.list(), [])
        with lspo.Client(self.services.address, token_file=self.token_file) as client:
            self.assertEqual(client.list(), [])

    def test_wrong_or_missing_token_is_refused(self):
        with lspo.Client(self.services.address, token="wrong-token-wrong-token", timeout=5) as c:
            with self.assertRaises(lspo.LspoError) as e:
                c.list()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("wrong bearer token", e.exception.message)
        with lspo.Client(self.services.address, timeout=5) as client:
            with self.assertRaises(lspo.LspoError) as e:
                client.list()
        self.assertIn(e.exception.code,
                      (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE))

    def test_token_without_tls_stays_on_this_host(self):
        # Refused before any channel is made: nothing is sent.
        with self.assertRaises(lspo.LspoError) as e:
            lspo.Client("scheduler.example:50060", token=self.TOKEN)
        self.assertIn("tls_ca", e.exception.message)

    def test_loopback_addresses(self):
        # runtime/grpc_server_test.cc LoopbackTest's lists.
        for a in ("127.0.0.1:50060", "127.3.2.1:1", "localhost:50060", "LOCALHOST:1",
                  "[::1]:50060", "::1", "ipv4:127.0.0.1:5", "unix:/tmp/lspo.sock",
                  "[::ffff:127.0.0.1]:1"):
            self.assertTrue(_is_loopback(a), a)
        for a in ("0.0.0.0:50060", ":50060", "[::]:50060", "10.0.0.1:50060",
                  "example.com:443", "128.0.0.1:1", "localhost.example.com:1"):
            self.assertFalse(_is_loopback(a), a)


@unittest.skipUnless(shutil.which("openssl"), "the openssl CLI is not installed")
class TlsTest(unittest.TestCase):
    """A scheduler with TLS (a self-signed certificate for 127.0.0.1) and a token."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="lspo-tls-")
        cls.cert, key = os.path.join(cls.dir, "cert.pem"), os.path.join(cls.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key,
                        "-out", cls.cert], check=True, capture_output=True)
        os.chmod(key, 0o600)
        cls.token_file = os.path.join(cls.dir, "token")
        with open(cls.token_file, "w") as f:
            f.write(TokenTest.TOKEN)
        os.chmod(cls.token_file, 0o600)
        cls.services = Services([f"--tls_cert={cls.cert}", f"--tls_key={key}",
                                 f"--auth_token_file={cls.token_file}"], peers=False,
                                tls_ca=cls.cert)

    @classmethod
    def tearDownClass(cls):
        cls.services.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_tls_and_token(self):
        with lspo.Client(self.services.address, token_file=self.token_file,
                         tls_ca=self.cert) as client:
            self.assertEqual(client.list(), [])
        with lspo.Client(self.services.address, tls_ca=self.cert, timeout=5) as client:
            with self.assertRaises(lspo.LspoError) as e:
                client.list()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAUTHENTICATED)


if __name__ == "__main__":
    unittest.main()
