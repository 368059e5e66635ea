"""lspo.data: records of every accepted shape written as exact JSONL lines."""
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

import lspo
from lspo import data

try:
    import pyarrow
    import pyarrow.parquet as pq
except ImportError:  # the parquet tests then check the error instead
    pyarrow = None

SHAREGPT = [
    {"id": "a1", "conversations": [
        {"from": "system", "value": "You tag cooking questions."},
        {"from": "human", "value": "Tags for: how long to rest a steak?"},
        {"from": "gpt", "value": "beef, resting"}]},
    {"id": "a2", "system": "Be brief.", "conversations": [
        {"from": "human", "value": "Salt pasta water?"},
        {"from": "gpt", "value": "Yes."},
        {"from": "human", "value": "How much?"},
        {"from": "gpt", "value": "About 1%. Café-style: ☕"}]},
]
SHAREGPT_LINES = [
    '{"messages": [{"role": "system", "content": "You tag cooking questions."}, '
    '{"role": "user", "content": "Tags for: how long to rest a steak?"}, '
    '{"role": "assistant", "content": "beef, resting"}]}',
    '{"messages": [{"role": "system", "content": "Be brief."}, '
    '{"role": "user", "content": "Salt pasta water?"}, {"role": "assistant", "content": "Yes."}, '
    '{"role": "user", "content": "How much?"}, '
    '{"role": "assistant", "content": "About 1%. Café-style: ☕"}]}',
]


class FakeClassLabel:
    """What datasets.ClassLabel shows of itself: its names."""

    def __init__(self, names):
        self.names = names


class FakeDataset:
    """A datasets.Dataset as lspo sees it (duck-typed): iterable of dicts, with features."""

    def __init__(self, rows, features):
        self.rows, self.features = rows, features

    def __iter__(self):
        return iter(self.rows)


class DataTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lspo-data-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, source, **kw):
        path = os.path.join(self.tmp, "out.jsonl")
        n = lspo.to_jsonl(source, path, **kw)
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        self.assertEqual(lines[-1], "")  # every line ends with a newline
        self.assertEqual(n, len(lines) - 1)
        return lines[:-1]

    def test_sharegpt_records_become_chat_lines(self):
        self.assertEqual(self.write(SHAREGPT), SHAREGPT_LINES)
        self.assertEqual(self.write(iter(SHAREGPT), format="sharegpt"), SHAREGPT_LINES)

    def test_sharegpt_roles_and_errors(self):
        rec = {"conversations": [{"from": "user", "value": "hi"}, {"from": "bing", "value": "yo"}]}
        with self.assertRaises(lspo.LspoError) as e:
            self.write([SHAREGPT[0], rec])
        self.assertIn('record 1: conversations[1]: speaker "bing" has no chat role',
                      e.exception.message)
        self.assertIn('roles={"bing": "assistant"}', e.exception.message)
        self.assertEqual(self.write([rec], roles={"bing": "assistant"}), [
            '{"messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "yo"}]}'])
        with self.assertRaises(lspo.LspoError) as e:
            lspo.sharegpt_to_chat({"conversations": [{"from": "gpt", "value": 3}]})
        self.assertIn('"value" must be a string (a int)', e.exception.message)

    def test_dataset_with_class_labels_becomes_classification_lines(self):
        ds = FakeDataset([{"text": "WIN a cruise now", "label": 1, "idx": 0},
                          {"text": "late, save me a seat", "label": 0, "idx": 1}],
                         {"label": FakeClassLabel(["ham", "spam"]), "text": object()})
        self.assertEqual(self.write(ds), ['{"label": "spam", "text": "WIN a cruise now"}',
                                          '{"label": "ham", "text": "late, save me a seat"}'])
        plain = [{"text": "t", "label": 3}]
        self.assertEqual(self.write(plain), ['{"label": "3", "text": "t"}'])

    def test_chat_alpaca_and_prompt_completion_keep_their_keys_only(self):
        chat = [{"messages": [{"role": "user", "content": "q", "name": "x"},
                              {"role": "assistant", "content": "a"}], "source": "web"}]
        self.assertEqual(self.write(chat), [
            '{"messages": [{"role": "user", "content": "q"}, '
            '{"role": "assistant", "content": "a"}]}'])
        alpaca = [{"instruction": "Tag it.", "input": "Rest steak?", "output": "beef"},
                  {"instruction": "Say hi.", "output": "hi", "extra": 1}]
        self.assertEqual(self.write(alpaca), [
            '{"instruction": "Tag it.", "input": "Rest steak?", "output": "beef"}',
            '{"instruction": "Say hi.", "output": "hi"}'])
        pc = [{"prompt": "Question: salt?\nTags:", "completion": " salt"},
              {"prompt": [{"role": "user", "content": "salt?"}],
               "completion": [{"role": "assistant", "content": "salt"}]}]
        self.assertEqual(self.write(pc), [
            '{"prompt": "Question: salt?\\nTags:", "completion": " salt"}',
            '{"prompt": [{"role": "user", "content": "salt?"}], '
            '"completion": [{"role": "assistant", "content": "salt"}]}'])

    def test_bad_input_names_the_record(self):
        cases = [
            ([{"question": "q", "answer": "a"}], "record 0 has the keys ['answer', 'question']"),
            ([{"text": "just text"}], "use write_text()"),
            ([SHAREGPT[0], {"instruction": "i", "output": "o"}],
             "record 1 is alpaca but record 0 is chat: one file holds one shape"),
            ([{"messages": [{"role": "tool", "content": "x"}]}],
             'record 0: messages[0]: role "tool"; supported roles: system, user, assistant'),
            ([{"instruction": "i"}], 'record 0: "output" must be a string (missing)'),
            ([{"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}],
             "must both be strings or both lists"),
            ([], "no records"),
        ]
        for source, words in cases:
            with self.subTest(words=words):
                with self.assertRaises(lspo.LspoError) as e:
                    self.write(source)
                self.assertIn(words, e.exception.message)
        self.assertEqual(os.listdir(self.tmp), [])  # nothing half-written is left

    def test_write_text(self):
        path = os.path.join(self.tmp, "corpus.txt")
        self.assertEqual(lspo.write_text([{"text": "one"}, {"text": "two"}], path), 2)
        with open(path) as f:
            self.assertEqual(f.read(), "one\n\ntwo\n")


@unittest.skipIf(pyarrow is None, "pyarrow is not installed")
class ParquetTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lspo-parquet-")
        self.addCleanup(shutil.rmtree, self.tmp)

    def lines(self, table, **kw):
        src, out = os.path.join(self.tmp, "in.parquet"), os.path.join(self.tmp, "out.jsonl")
        pq.write_table(table, src)
        lspo.to_jsonl(src, out, **kw)
        with open(out, encoding="utf-8") as f:
            return f.read().splitlines()

    def test_sharegpt_parquet(self):
        # conversations: list<struct<from, value>>; system null where a record has none.
        table = pyarrow.Table.from_pylist([dict(r, system=r.get("system")) for r in SHAREGPT])
        self.assertEqual(self.lines(table), SHAREGPT_LINES)
        self.assertEqual([r["id"] for r in lspo.read_parquet(
            os.path.join(self.tmp, "in.parquet"), batch_size=1)], ["a1", "a2"])

    def test_class_labels_from_the_datasets_metadata(self):
        table = pyarrow.Table.from_pylist([{"text": "WIN now", "label": 1},
                                           {"text": "see you", "label": 0}])
        features = {"text": {"dtype": "string", "_type": "Value"},
                    "label": {"names": ["ham", "spam"], "_type": "ClassLabel"}}
        table = table.replace_schema_metadata(
            {"huggingface": json.dumps({"info": {"features": features}})})
        self.assertEqual(self.lines(table), ['{"label": "spam", "text": "WIN now"}',
                                             '{"label": "ham", "text": "see you"}'])

    def test_no_recognised_columns(self):
        table = pyarrow.Table.from_pylist([{"question": "q", "answer": "a"}])
        with self.assertRaises(lspo.LspoError) as e:
            self.lines(table)
        self.assertIn("record 0 has the keys ['answer', 'question']", e.exception.message)

    def test_not_parquet(self):
        path = os.path.join(self.tmp, "bad.parquet")
        with open(path, "w") as f:
            f.write("not parquet")
        with self.assertRaises(lspo.LspoError) as e:
            lspo.to_jsonl(path, os.path.join(self.tmp, "out.jsonl"))
        self.assertIn("bad.parquet", e.exception.message)


class NoPyarrowTest(unittest.TestCase):
    def test_parquet_without_pyarrow_says_what_to_install(self):
        with mock.patch.dict(sys.modules, {"pyarrow": None, "pyarrow.parquet": None}):
            with self.assertRaises(lspo.LspoError) as e:
                list(data.read_parquet("x.parquet"))
        self.assertIn("pip install pyarrow", e.exception.message)


if __name__ == "__main__":
    unittest.main()
