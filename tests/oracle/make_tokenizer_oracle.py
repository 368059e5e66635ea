#!/opt/oracle/bin/python
"""Oracle token ids for tests/text/tokenizer_test.cc (and the ChatML template text).

Run from the repository root:
    /opt/oracle/bin/python tests/oracle/make_tokenizer_oracle.py
writes tests/oracle/data/tokenizer_oracle.json.

Reference tokenizer (SmolLM2-135M-Instruct, from the GGUF):
  transformers.AutoTokenizer.from_pretrained("models", gguf_file=...) builds a `tokenizers`
  BPE from the GGUF vocabulary/merges/specials and the GGUF chat template. Its GGUF converter
  (transformers 5.24) sets the pre-tokenizer to ByteLevel alone, dropping the digit split that
  tokenizer.ggml.pre = "smollm" prescribes (llama.cpp src/llama-vocab.cpp: "\\p{N}" then the GPT-2
  regex; the Hub tokenizer.json of SmolLM2 is Sequence[Digits(individual_digits=True),
  ByteLevel]). We therefore replace the backend pre-tokenizer by that Sequence before encoding.
  The two differ only where whitespace or letters meet digits (e.g. "  2": ByteLevel alone gives
  "Ġ","Ġ","2", the smollm split gives "ĠĠ","2"); the JSON lists the cases that differ under
  "differs_from_transformers_gguf_loader".

GPT-2 cases: a `tokenizers` BPE built from datasets/gpt2-tokenizer/{vocab.json,merges.txt}
with the ByteLevel pre-tokenizer (the layout of the Hub gpt2 tokenizer.json).

Optional check of the C++ exporter (BpeTokenizer::WriteHfFiles):
    /opt/oracle/bin/python tests/oracle/make_tokenizer_oracle.py --check-hf-dir DIR
loads DIR with AutoTokenizer and compares its ids and chat template output with the oracle
JSON (no file is written).
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, pre_tokenizers, decoders
from tokenizers.models import BPE
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(ROOT, "datasets")
OUT = os.path.join(ROOT, "tests", "oracle", "data", "tokenizer_oracle.json")

STRINGS = [
    ("hello", "Hello world"),
    ("english", "The quick brown fox jumps over the lazy dog."),
    ("digits", "2024 and 3.14"),
    ("digits_spaces", "  2 spaces, x2y, a 7, \n9, 10000000 and -3.5e10"),
    ("code", "def f(x):\n    return x**2 + 1  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
    ("whitespace", "a  b   c\n\n\nd\t\te \t x  \n  \n"),
    ("leading_trailing", "   leading and trailing   "),
    ("punctuation", "Wait... what?! (yes) [no] {maybe}; a-b_c/d\\e \"quoted\" 'single' -- ok."),
    ("contractions", "I'm can't we're they've he'll she'd it's DON'T 'sup ''s you'RE"),
    ("accents", "naïve café"),
    ("combining", "cafe\u0301 nai\u0308ve"),
    ("chinese", "我爱自然语言处理。今天天气很好！"),
    ("emoji", "Hello 👋🏽 world 🌍! 😀😀 👨‍👩‍👧"),
    ("scripts", "Привет мир Γειά σου مرحبا שלום नमस्ते"),
    ("unicode_spaces", "a\u00a0b\u3000c\u2028d\x0be\x0cf\x85g\u2003 h"),
    ("unicode_numbers", "£1,000.50 or 12.5% ² ½ Ⅻ ٣٤ ①"),
    ("specials", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><repo_name>x<file_sep>"),
    ("partial_special", "<|im_start| <|im_end <im_start> |>"),
    ("empty", ""),
    ("single_space", " "),
    ("newline_only", "\n"),
    # Bytes 0x04 0x13 0x1D and the lead byte 0xF1 of U+40000 have no symbol in the SmolLM2
    # vocabulary; HF drops them (BPE without unk_token).
    ("unmapped_bytes", "a\x04b !\x13! c\x1dd x\U00040000y"),
]

CHATS = [
    ("user_only_gen",
     [{"role": "user", "content": "Is this message spam or ham?\n\nWINNER!! Call 09061701461 now."}],
     True),
    ("system_user_assistant",
     [{"role": "system", "content": "You classify SMS messages."},
      {"role": "user", "content": "Hi there, how are you?"},
      {"role": "assistant", "content": "ham"}],
     False),
    ("multi_turn_gen",
     [{"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3.14 * 2?"}],
     True),
]


def bytes_to_unicode():
    """openai/gpt-2 src/encoder.py."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def smollm_tokenizer():
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "models"),
                                        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    plain = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    return tok, plain


def gpt2_tokenizer():
    d = os.path.join(SHARED, "gpt2-tokenizer")
    t = Tokenizer(BPE.from_file(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    return t


def all_strings():
    out = list(STRINGS)
    # test.tsv is UTF-8 except some spam lines stored in Latin-1 ("\xa3" = "£"); such lines are
    # decoded as Latin-1, as lspo::data::LoadLabeledTsv does. Rows 0-19 are UTF-8; row 158 is
    # the first Latin-1 row.
    with open(os.path.join(SHARED, "sms-spam", "test.tsv"), "rb") as f:
        lines = f.read().split(b"\n")
    for i in list(range(20)) + [158]:
        try:
            line = lines[i].decode("utf-8")
        except UnicodeDecodeError:
            line = lines[i].decode("latin-1")
        label, text = line.split("\t", 1)
        out.append((f"sms_test_{i}", text))
    with open(os.path.join(SHARED, "moby-dick", "moby-dick.txt"), encoding="utf-8") as f:
        out.append(("moby_2000", f.read()[:2000]))
    return out


def encode(backend, text):
    return backend.encode(text, add_special_tokens=False).ids


def make():
    tok, plain = smollm_tokenizer()
    backend = tok.backend_tokenizer
    cases, differs = [], []
    for name, text in all_strings():
        ids = encode(backend, text)
        if encode(plain, text) != ids:
            differs.append(name)
        cases.append({"name": name, "text": text, "ids": ids})
    chats = []
    for name, messages, gen in CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        chats.append({"name": name, "messages": messages, "add_generation_prompt": gen,
                      "text": rendered, "ids": encode(backend, rendered)})
    g = gpt2_tokenizer()
    gpt2_cases = []
    for name, text in all_strings():
        if name in ("specials", "partial_special"):
            continue  # GPT-2 files carry no added-token list here
        gpt2_cases.append({"name": name, "text": text, "ids": encode(g, text)})
    import tokenizers
    import transformers
    data = {
        "generator": "tests/oracle/make_tokenizer_oracle.py",
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "special_ids": {"bos": tok.bos_token_id, "eos": tok.eos_token_id,
                        "pad": tok.pad_token_id, "unk": tok.unk_token_id},
        "vocab_size": len(tok),
        "bytes_without_symbol": [b for b, c in sorted(bytes_to_unicode().items())
                                 if backend.token_to_id(c) is None],
        "differs_from_transformers_gguf_loader": differs,
        "smollm_cases": cases,
        "chat_cases": chats,
        "gpt2_cases": gpt2_cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    print(f"wrote {OUT}: {len(cases)} smollm, {len(chats)} chat, {len(gpt2_cases)} gpt2 cases;"
          f" differs from the plain GGUF loader: {differs}")


def check_hf_dir(d):
    with open(OUT, encoding="utf-8") as f:
        data = json.load(f)
    tok = AutoTokenizer.from_pretrained(d)
    bad = 0
    for c in data["smollm_cases"] + data["chat_cases"]:
        got = tok(c["text"], add_special_tokens=False).input_ids
        if got != c["ids"]:
            bad += 1
            print("MISMATCH ids", c["name"])
        if tok.decode(c["ids"]) != c["text"] and c["name"] != "unmapped_bytes":
            bad += 1  # unmapped_bytes loses the bytes Encode drops; every other case round-trips
            print("MISMATCH decode", c["name"])
    for c in data["chat_cases"]:
        r = tok.apply_chat_template(c["messages"], tokenize=False,
                                    add_generation_prompt=c["add_generation_prompt"])
        if r != c["text"]:
            bad += 1
            print("MISMATCH chat", c["name"])
    ids = data["special_ids"]
    got = {"bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id,
           "unk": tok.unk_token_id}
    if got != ids:
        bad += 1
        print("MISMATCH special ids", got, ids)
    print(f"{d}: {bad} mismatches; type {type(tok).__name__}; pre_tokenizer "
          f"{json.loads(tok.backend_tokenizer.to_str())['pre_tokenizer']['type']}")
    return bad


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--check-hf-dir")
    a = p.parse_args()
    if a.check_hf_dir:
        sys.exit(1 if check_hf_dir(a.check_hf_dir) else 0)
    make()
