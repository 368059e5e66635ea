"""The scheduler client: submit, watch, status, cancel and list jobs over gRPC.

The channel is made as lspctl makes it (runtime/grpc_server.cc MakeChannel): plaintext
without a token; with a bearer token, TLS when a CA is given, else gRPC's local credentials
(loopback only, the kind the scheduler serves with a token and no certificate); the token is
sent as `authorization: Bearer <token>` on every call; HTTP/2 keepalive pings every 10 s.
"""
import enum
import ipaddress
from typing import Any, Iterator, List, Mapping, Optional

import grpc

from lspo._proto import job_spec_pb2, scheduler_pb2, scheduler_pb2_grpc
from lspo.errors import JobFailedError, LspoError, from_rpc_error
from lspo.spec import Overrides, SpecLike, load_spec

JobStatus = scheduler_pb2.JobStatus

# runtime/grpc_server.h kKeepaliveSeconds: the services accept a ping every 5 s or more.
_KEEPALIVE_MS = 10_000


class JobState(enum.IntEnum):
    """A job's state (proto/scheduler.proto JobState; the same numbers)."""

    JOB_STATE_UNSPECIFIED = 0
    QUEUED = 1
    RUNNING = 2
    CHECKPOINTING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6

    @property
    def finished(self) -> bool:
        """Whether the job has ended (SUCCEEDED, FAILED or CANCELLED)."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def progress_line(status: JobStatus) -> str:
    """One line about `status`, as lspctl's progress bar reads without the bar:
    "job-...: RUNNING step 12/60 loss 0.4312 tok/s 210 ETA 250s | eval accuracy 0.9 | training".
    """
    total = str(status.total_steps) if status.total_steps > 0 else "?"
    line = f"{status.job_id}: {JobState(status.state).name} step {status.step}/{total}"
    if status.HasField("last_step"):
        s = status.last_step
        line += f" loss {s.loss:.4f} tok/s {s.tokens_per_second:.0f} ETA {status.eta_seconds:.0f}s"
    if status.evals:
        e = status.evals[-1]
        if e.generated_examples > 0:
            line += f" | eval F1 {e.f1:.4f}"
        elif status.spec.data.format == job_spec_pb2.DATA_FORMAT_CLASSIFICATION:
            line += f" | eval accuracy {e.accuracy:.4f}"
        else:
            line += f" | eval loss {e.loss:.4f}"
    if status.error:
        line += f" | error: {status.error}"
    elif status.phase:
        line += f" | {status.phase}"
    return line


def _is_loopback(address: str) -> bool:
    """Whether a gRPC target names this host, as the services judge it (runtime/grpc_server.h
    IsLoopbackAddress): 127.0.0.0/8, ::1 (also IPv4-mapped), localhost, a unix socket."""
    a = address.lower()
    if a.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("ipv4:", "ipv6:", "dns:///", "dns:"):
        if a.startswith(scheme):
            a = a[len(scheme):]
            break
    if a.startswith("["):
        host = a[1:a.find("]")]
    elif a.count(":") == 1:
        host = a.rsplit(":", 1)[0]
    else:
        host = a  # a bare host, or a bare IPv6 address without a port
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def _read_token_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise LspoError(f"token file {path} is empty: write the token into it")
    return token


class Client:
    """A connection to a running lsp_scheduler.

    Args:
        address: the scheduler's host:port (lspctl's --scheduler; default 127.0.0.1:50060).
        token: the deployment's bearer token (the content of the services'
            --auth_token_file), sent on every call; None = none.
        token_file: a file holding the token, instead of `token` (as lspctl's
            --auth_token_file).
        tls_ca: PEM file of the CA that signed the scheduler's --tls_cert: the channel then
            uses TLS (needed to send a token to a scheduler that is not on this host).
        timeout: seconds each unary call may take (submit, status, cancel, list).
        lspctl: the lspctl binary used to read spec files (lspo.spec.load_spec).
        spec_reader: "auto", "lspctl" or "python" (lspo.spec.load_spec).
    Raises:
        LspoError: a token without TLS to a scheduler that is not on this host (it would
            travel in clear text), or an empty token file.

    Usable as a context manager (closes the channel).
    """

    def __init__(self, address: str = "127.0.0.1:50060", *, token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 timeout: float = 60.0, lspctl: Optional[str] = None,
                 spec_reader: str = "auto") -> None:
        if token is None and token_file:
            token = _read_token_file(token_file)
        options = [("grpc.keepalive_time_ms", _KEEPALIVE_MS),
                   ("grpc.keepalive_timeout_ms", _KEEPALIVE_MS),
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0)]
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        elif token:
            if not _is_loopback(address):
                raise LspoError(
                    f"a token is given but no tls_ca: the token would travel in clear text to "
                    f"{address}; pass tls_ca=CA.pem (the CA of the scheduler's --tls_cert)")
            kind = (grpc.LocalConnectionType.UDS if address.startswith("unix")
                    else grpc.LocalConnectionType.LOCAL_TCP)
            creds = grpc.local_channel_credentials(kind)
        else:
            creds = None
        if token:
            assert creds is not None
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        self.address: str = address
        self.timeout: float = timeout
        self.lspctl: Optional[str] = lspctl
        self.spec_reader: str = spec_reader
        self._channel = (grpc.secure_channel(address, creds, options) if creds is not None
                         else grpc.insecure_channel(address, options))
        stub = scheduler_pb2_grpc.SchedulerStub
        self._stub = stub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Closes the channel; the client cannot be used afterwards."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e, f"scheduler {self.address}") from None

    def submit(self, spec: SpecLike, *, overrides: Overrides = (),
               output_dir: Optional[str] = None) -> "Job":
        """Validates and queues a job.

        Args:
            spec: a JobSpec, a dict, a .yaml / .yml / .json path or YAML / JSON text (read by
                lspo.spec.load_spec with this client's spec_reader). Relative paths in it
                resolve against the scheduler's working folder.
            overrides: KEY=VALUE spec overrides ("max_steps=2", "optim.lr=1e-3") or a mapping.
            output_dir: the job's output folder (default: the scheduler's
                --runs_root/NAME-JOB_ID).
        Returns:
            the Job, queued.
        Raises:
            LspoError: INVALID_ARGUMENT for a spec that cannot be read or that the scheduler
                refuses (the message names the field), NOT_FOUND for a missing model or data
                file, PERMISSION_DENIED for a path outside the scheduler's --allowed_roots,
                UNAUTHENTICATED for a missing or wrong token, UNAVAILABLE when no scheduler
                answers.
        """
        if output_dir:
            overrides = ({**overrides, "output_dir": output_dir}
                         if isinstance(overrides, Mapping)
                         else [*overrides, f"output_dir={output_dir}"])
        job_spec = load_spec(spec, overrides, reader=self.spec_reader, lspctl=self.lspctl)
        reply = self._call("SubmitJob", scheduler_pb2.SubmitJobRequest(spec=job_spec))
        return Job(self, reply.job_id)

    def job(self, job_id: str) -> "Job":
        """The Job of an id (e.g. from list()); not checked until it is used."""
        return Job(self, job_id)

    def status(self, job_id: str) -> JobStatus:
        """The current status of a job (proto/scheduler.proto JobStatus: state, step,
        total_steps, last_step, evals, output_dir, error, ...).

        Raises LspoError: NOT_FOUND for an unknown id; see submit() for the others.
        """
        status: JobStatus = self._call("GetJob", scheduler_pb2.GetJobRequest(job_id=job_id))
        return status

    def list(self) -> List[JobStatus]:
        """The status of every job the scheduler knows, in its order."""
        return list(self._call("ListJobs", scheduler_pb2.ListJobsRequest()).jobs)

    def cancel(self, job_id: str) -> JobState:
        """Cancels a queued job (at once) or a running one (it stops after its current step or
        between the batches of an evaluation, then ends CANCELLED).

        Returns:
            the state after the request: CANCELLED for a queued job, RUNNING (or
            CHECKPOINTING) for a running one, or the final state of a job that had already
            ended (which is left as it was).
        Raises:
            LspoError: NOT_FOUND for an unknown id; see submit() for the others.
        """
        reply = self._call("CancelJob", scheduler_pb2.CancelJobRequest(job_id=job_id))
        return JobState(reply.state)

    def watch(self, job_id: str, *, timeout: Optional[float] = None) -> Iterator[JobStatus]:
        """Yields the job's status after every step, evaluation and state change, ending with
        its final status (SUCCEEDED, FAILED or CANCELLED). The steps completed before the
        watch began come first (each as a RUNNING status with its last_step), so a job that
        has already ended yields its steps again, then its final status.

        Args:
            timeout: seconds the whole watch may take (None = until the job ends).
        Raises:
            LspoError: NOT_FOUND for an unknown id, DEADLINE_EXCEEDED after `timeout`; see
                submit() for the others.
        """
        stream = self._stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id),
                                     timeout=timeout)
        try:
            for status in stream:
                yield status
        except grpc.RpcError as e:
            raise from_rpc_error(e, f"scheduler {self.address}") from None
        finally:
            stream.cancel()  # a consumer that stops early frees the stream


class Job:
    """A job on a scheduler (Client.submit, Client.job).

    Attributes:
        client: the Client it talks through.
        job_id: the scheduler's id ("job-<unix seconds>-<n>").
        last_status: the newest status seen by this object (None before the first).
    """

    def __init__(self, client: Client, job_id: str) -> None:
        self.client: Client = client
        self.job_id: str = job_id
        self.last_status: Optional[JobStatus] = None

    def __repr__(self) -> str:
        state = JobState(self.last_status.state).name if self.last_status else "?"
        return f"Job({self.job_id!r}, {state})"

    def status(self) -> JobStatus:
        """The current status (Client.status)."""
        self.last_status = self.client.status(self.job_id)
        return self.last_status

    def watch(self, *, timeout: Optional[float] = None) -> Iterator[JobStatus]:
        """Yields the status after every step, evaluation and state change until the job ends
        (Client.watch)."""
        for status in self.client.watch(self.job_id, timeout=timeout):
            self.last_status = status
            yield status

    def wait(self, *, timeout: Optional[float] = None, check: bool = False) -> JobStatus:
        """Waits for the job to end and returns its final status.

        Args:
            timeout: seconds to wait at most (None = until it ends).
            check: raise JobFailedError unless the job SUCCEEDED.
        Raises:
            JobFailedError: with `check`, the job ended FAILED or CANCELLED (its error).
            LspoError: as Client.watch.
        """
        seen = self.last_status
        if seen is None or not JobState(seen.state).finished:
            for _ in self.watch(timeout=timeout):
                pass
        final = self.last_status if self.last_status is not None else self.status()
        if check and JobState(final.state) != JobState.SUCCEEDED:
            name = JobState(final.state).name
            raise JobFailedError(f"job {self.job_id} {name}" +
                                 (f": {final.error}" if final.error else ""), name,
                                 final.output_dir)
        return final

    def cancel(self) -> JobState:
        """Asks the scheduler to cancel the job (Client.cancel)."""
        return self.client.cancel(self.job_id)

    @property
    def state(self) -> JobState:
        """The current state (asks the scheduler)."""
        return JobState(self.status().state)

    @property
    def output_dir(self) -> str:
        """The job's output folder as the scheduler names it (relative to the scheduler's
        working folder when the spec or --runs_root gave a relative one). Holds the model
        (config.json, model.safetensors, tokenizer files), summary.json, metrics.jsonl and
        report.html once the job has SUCCEEDED."""
        status = self.last_status if self.last_status is not None else self.status()
        return status.output_dir


__all__ = ["Client", "Job", "JobState", "JobStatus", "progress_line"]
