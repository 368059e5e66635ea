"""The exceptions of the lspo package."""
from typing import Optional

import grpc


class LspoError(Exception):
    """An LSP-Offload call or command failed.

    Attributes:
        code: the gRPC status code of a failed RPC (e.g. grpc.StatusCode.NOT_FOUND for an
            unknown job id, INVALID_ARGUMENT for a spec the scheduler refuses, UNAUTHENTICATED
            for a missing or wrong bearer token, UNAVAILABLE when no scheduler answers);
            INVALID_ARGUMENT too for a spec that lspctl or this package cannot read; None for
            the other failures that are not an RPC's (no lspctl, an lspctl command that
            failed, bad training data).
        message: the reason, as the scheduler or lspctl gave it.
    """

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None) -> None:
        super().__init__(f"{code.name}: {message}" if code is not None else message)
        self.code: Optional[grpc.StatusCode] = code
        self.message: str = message


class JobFailedError(LspoError):
    """A job ended FAILED or CANCELLED where success was required (Job.wait(check=True),
    run(check=True)).

    Attributes:
        state: the final state's name ("FAILED", "CANCELLED").
        output_dir: the job's output folder (its report.html and metrics.jsonl show the end).
    """

    def __init__(self, message: str, state: str, output_dir: str) -> None:
        super().__init__(message)
        self.state: str = state
        self.output_dir: str = output_dir


def from_rpc_error(e: grpc.RpcError, what: str = "scheduler") -> LspoError:
    """The LspoError for a failed gRPC call `e` to `what` (its code and details kept)."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    return LspoError(f"{what}: {details}", code)
