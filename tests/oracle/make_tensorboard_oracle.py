#!/usr/bin/env python3
"""Oracle for tests/report/tensorboard_test.cc: TensorBoard's own events writer and reader.

1. Writes tests/oracle/data/tensorboard_oracle.json with the fixed list of scalars
   (tag, step, value, wall_time) below.
2. Writes those scalars with the tensorboard package's own writer
   (tensorboard.summary.writer.event_file_writer.EventFileWriter, one Event per scalar with
   summary.value[0].simple_value, as its SummaryWriter does) and keeps the file as
   tests/oracle/data/tensorboard_events.tfevents.
3. Runs the C++ test binary in its oracle mode (LSPO_TB_ORACLE_OUT=DIR), which writes the
   same scalars, read from the JSON, with report/tensorboard.h's EventFileWriter into DIR.
4. Reads that C++-written file back with tensorboard's EventAccumulator
   (tensorboard.backend.event_processing.event_accumulator) and stores, per tag, the
   (step, value, wall_time) it reports in the JSON ("read_back"). It also checks here that
   the two files' records after the file_version one are the same bytes and that the
   accumulator reads the same values from both.

Made with tensorboard 2.21.0 (PyPI) in a venv:
  python3 -m venv /tmp/tbv && /tmp/tbv/bin/pip install tensorboard==2.21.0
Run from the repository root, after `ninja -C build tensorboard_test`:
  /tmp/tbv/bin/python tests/oracle/make_tensorboard_oracle.py [--test_binary=PATH]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import tensorboard
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

OUT_EVENTS = "tests/oracle/data/tensorboard_events.tfevents"
OUT_JSON = "tests/oracle/data/tensorboard_oracle.json"
ORACLE_TEST = "TensorBoardOracleTest.MatchesTensorBoardsWriterAndReader"

# Steps never decrease (TensorBoard drops earlier points of a tag when a step goes back).
# Covers step 0 and a 64-bit step, value 0.0 (still written: simple_value is in a oneof),
# negative, tiny, huge and non-float32 values (rounded to float32), integral wall times.
SCALARS = [
    ("eval/loss", 0, 10.8125, 1764600000.25),
    ("eval/accuracy", 0, 0.0, 1764600000.25),
    ("projector/bias_before_fit", 0, 6.683606652189488, 1764600001.5),
    ("projector/bias_after_fit", 0, 0.3746314200237707, 1764600001.5),
    ("train/loss", 1, 8.5459623336792, 1764600002.123456),
    ("train/learning_rate", 1, 0.00011999999999999999, 1764600002.123456),
    ("time/step_s", 1, 26.752440630999445, 1764600002.123456),
    ("offload/bytes_to_cpu", 1, 0.0, 1764600002.123456),
    ("memory/worker_peak_rss_bytes", 1, 3924799488.0, 1764600002.123456),
    ("train/loss", 2, 3.254483699798584, 1764600041.0),
    ("train/grad_norm", 2, -1.5e-8, 1764600041.0),
    ("train/loss", 3, 1e30, 1764600053.999999),
    ("a tag/with spaces and ünïcode", 3, 0.1, 1764600054.0),
    ("train/loss", 12345678901, 1.2372187376022339, 1764600100.5),
]


def scalars_json():
    return [{"tag": t, "step": s, "value": v, "wall_time": w} for t, s, v, w in SCALARS]


def write_with_tensorboard(logdir):
    w = EventFileWriter(logdir)
    for tag, step, value, wall_time in SCALARS:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag,
                                                                       simple_value=value)])
        w.add_event(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))
    w.close()
    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    return path


def records(path):
    """The records of a TFRecord file (framing checked by tensorboard's reader elsewhere)."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 8], "little")
        out.append(data[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
    return out


def read_back(path):
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
            for tag in sorted(acc.Tags()["scalars"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test_binary", default="build/tests/report/tensorboard_test")
    args = ap.parse_args()
    oracle = {"tensorboard_version": tensorboard.__version__, "scalars": scalars_json()}
    with open(OUT_JSON, "w") as f:
        json.dump(oracle, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with tempfile.TemporaryDirectory() as tmp:
        tb_dir, cc_dir = os.path.join(tmp, "tb"), os.path.join(tmp, "cc")
        os.makedirs(cc_dir)
        shutil.copyfile(write_with_tensorboard(tb_dir), OUT_EVENTS)
        env = dict(os.environ, LSPO_TB_ORACLE_OUT=cc_dir)
        subprocess.run([args.test_binary, f"--gtest_filter={ORACLE_TEST}"], env=env,
                       check=True)
        (cc_path,) = glob.glob(os.path.join(cc_dir, "events.out.tfevents.*"))
        tb_records, cc_records = records(OUT_EVENTS), records(cc_path)
        if tb_records[1:] != cc_records[1:]:
            sys.exit("the C++ writer's event records differ from tensorboard's")
        oracle["read_back"] = read_back(cc_path)
        if oracle["read_back"] != read_back(OUT_EVENTS):
            sys.exit("EventAccumulator reads other values from the two files")
    with open(OUT_JSON, "w") as f:
        json.dump(oracle, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {OUT_EVENTS} and {OUT_JSON} (tensorboard {tensorboard.__version__}, "
          f"{len(tb_records) - 1} scalar records identical to the C++ writer's)")


if __name__ == "__main__":
    main()
