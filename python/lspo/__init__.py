"""lspo: the Python client of LSP-Offload (docs/python.md).

    import lspo
    client = lspo.Client("127.0.0.1:50060")              # a running lsp_scheduler
    job = client.submit("examples/smollm2-sms-spam.yaml")
    for status in job.watch():
        print(lspo.progress_line(status))
    print(job.output_dir)                                  # the fine-tuned model and reports

- Client / Job: submit, watch, status, cancel and list jobs over the scheduler's gRPC API.
- plan(spec): the memory plan in every mode; run(spec): a job in embedded mode (both
  through the lspctl binary).
- to_jsonl / write_text: training data from a datasets.Dataset, a parquet file or ShareGPT
  records in the shapes a job reads.
- load_spec: a spec file, text or dict as the JobSpec message.
Errors are LspoError (with the gRPC status code of a failed call) and JobFailedError.
"""
from lspo.client import Client, Job, JobState, JobStatus, progress_line
from lspo.data import (FORMATS, SHAREGPT_ROLES, convert, read_parquet, sharegpt_to_chat,
                       to_jsonl, write_text)
from lspo.errors import JobFailedError, LspoError
from lspo.lspctl import Plan, PlanRow, RunResult, find_lspctl, plan, run
from lspo.spec import JobSpec, load_spec, parse_spec

__version__ = "0.1.0"

__all__ = [
    "Client", "Job", "JobState", "JobStatus", "JobSpec", "progress_line",
    "plan", "run", "find_lspctl", "Plan", "PlanRow", "RunResult",
    "to_jsonl", "write_text", "convert", "read_parquet", "sharegpt_to_chat", "FORMATS",
    "SHAREGPT_ROLES", "load_spec", "parse_spec", "LspoError", "JobFailedError",
]
