"""The generated protobuf and gRPC modules (made at build time by setup.py from ../proto).

Everything else in the package imports the messages from here, so that a package built
without its stubs fails with one clear error instead of an ImportError deep inside.
"""
try:
    from lspo._gen.proto import job_spec_pb2, metrics_pb2, scheduler_pb2, scheduler_pb2_grpc
except ImportError as e:  # pragma: no cover - only a broken install reaches this
    raise ImportError(
        "lspo: the generated gRPC stubs are missing (lspo/_gen): install the package with "
        "`pip install ./python` from the repository root, which generates them from proto/ "
        f"({e})") from e

__all__ = ["job_spec_pb2", "metrics_pb2", "scheduler_pb2", "scheduler_pb2_grpc"]
