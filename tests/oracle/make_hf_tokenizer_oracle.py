#!/usr/bin/env python3
"""Hugging Face tokenizer.json folders and their oracle ids for tests/text/hf_tokenizer_test.cc.

Run from the repository root (needs `tokenizers` and `transformers`; no GPU, no network):
    /opt/oracle/bin/python tests/oracle/make_hf_tokenizer_oracle.py
writes
    tests/oracle/data/hf_tokenizers/<family>/{tokenizer.json, tokenizer_config.json[,
        chat_template.jinja]}                         the tokenizers under test (committed)
    tests/oracle/data/hf_tokenizer_oracle.json        the test lines and, per family, the ids
                                                      that `tokenizers` gives for each line

Families (each trained here with the `tokenizers` BpeTrainer on real text, in the layout of the
named model family's Hub tokenizer.json, then reloaded with Tokenizer.from_file):
  llama3         Split(Llama 3 regex, Isolated) + ByteLevel(use_regex=False); ignore_merges=true
                 with 64 whole-word tokens the merges do not rebuild (as in tiktoken vocabularies);
                 post-processor Sequence[ByteLevel, TemplateProcessing("<|begin_of_text|> $A")];
                 256-style added specials after the model vocabulary; merges as [["A","B"]].
  qwen2          NFC + Split(Qwen2 regex) + ByteLevel(use_regex=False); merges in the older
                 "A B" string form; <|endoftext|>/<|im_start|>/<|im_end|> special and
                 <tool_call>/</tool_call> added but not special; chat template in
                 chat_template.jinja (transformers >= 4.43 layout), bos_token null.
  spm_legacy     SentencePiece-style BPE (Llama 2 / TinyLlama layout): byte_fallback, <unk>,
                 <s>, </s>, <0x00>..<0xFF> at ids 3..258, normalizer
                 Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, decoder
                 Sequence[Replace, ByteFallback, Fuse, Strip], TemplateProcessing("<s> $A");
                 a non-special added token with normalized=true ("<think>", what
                 tokenizer.add_tokens() makes); chat_template as a list of {name, template}.
  spm_metaspace  the same model in the Mistral / transformers legacy=False layout: no normalizer,
                 Metaspace(prepend_scheme="first", split=False), decoder
                 Sequence[Metaspace, ByteFallback, Fuse]; [INST]/[/INST] special with
                 lstrip/rstrip, "<sep>" single_word.
  spm_unk        the same model without byte_fallback (unknown characters -> fused <unk>),
                 Metaspace(prepend_scheme="always", split=True), Metaspace decoder.
  misc           byte-level with the remaining supported options: NFKC + Replace(Regex),
                 Split behaviours merged_with_previous / contiguous / removed / merged_with_next
                 / invert, Digits(individual_digits=False), ByteLevel(add_prefix_space=True,
                 use_regex=True); added tokens with lstrip / rstrip / single_word / normalized.
  smollm2        SmolLM2-135M-Instruct's tokenizer, loaded from
                 models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup fetches it) by
                 transformers' GGUF loader, with the Hub
                 pre-tokenizer Sequence[Digits(individual_digits=True), ByteLevel] put back (the
                 GGUF loader drops the Digits split, see make_tokenizer_oracle.py), saved by
                 save_pretrained (tokenizer.json compact). Skipped when the GGUF is absent.

Text: training text is Moby-Dick and the SMS spam training set (datasets/, committed), an
excerpt of cooking.stackexchange titles (tests/oracle/data/hf_tokenizers/corpus/, copied from
the team's data folder's cooking-stackexchange/ by --copy-corpus=DIR) and the hand-written
lines below.
Test lines (the same for every family): Moby-Dick lines and multi-line passages, SMS test
messages, cooking test titles, and hand-written lines covering code, digit runs, whitespace runs
(tabs, spaces, \\r\\n), non-Latin scripts, emoji, contractions, special tokens.

For each family and line the oracle stores
    ids       Tokenizer.from_file(dir/tokenizer.json).encode(line, add_special_tokens=False).ids
and, only where it is not the line itself, the decoded text
    Tokenizer.decode(ids, skip_special_tokens=False).
"""
import argparse
import importlib.metadata
import json
import os
import shutil
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "oracle", "data")
HF_DIR = os.path.join(DATA, "hf_tokenizers")
CORPUS_DIR = os.path.join(HF_DIR, "corpus")
COOKING = os.path.join(CORPUS_DIR, "cooking-stackexchange-excerpt.tsv")
# --copy-corpus=DIR: the cooking-stackexchange folder (train.tsv, test.tsv) of the team's data.
OUT = os.path.join(DATA, "hf_tokenizer_oracle.json")
GGUF_DIR = os.path.join(ROOT, "models")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
LLAMA2_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}")

# Hand-written lines: code, digits, whitespace, scripts, emoji, specials (short; ours).
HANDWRITTEN = [
    "def f(x):\n    return x**2 + 1  # square\n",
    "if __name__ == '__main__':\n\tprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "{\"key\": [1, 2.5, -3e10], \"nested\": {\"a\": null, \"b\": true}}",
    "x = np.linspace(0, 1, 1000)  # 1000 points\r\ny = x ** 2\r\n",
    "git commit -m \"fix: off-by-one in tokenizer (#1234)\"",
    "https://example.com/path/to/page?query=1&lang=en#section-2",
    "user@example.org wrote on 2024-03-15T12:34:56Z:",
    "    indented four spaces",
    "\tone tab\t\ttwo tabs\t\t\tthree tabs",
    "trailing spaces   ",
    "   leading spaces",
    "a  b   c    d     e",
    "line one\r\nline two\r\n\r\nline four",
    "\n\n\nthree newlines first",
    "mixed \t \n \r\n whitespace \u00a0 runs",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    "1234567890",
    "3.14159265358979323846",
    "Call 09061701461 now or 0800 123 4567!",
    "Prices: $1,000.50, \u00a312.99, \u20ac7, \u00a5300",
    "12 + 345 = 357; 6789 * 10 = 67890",
    "phone: +1 (555) 010-9999 ext. 42",
    "Version 2.0.1-rc3 released 2023/11/07",
    "\u00b2 \u00bd \u2167 \u0663\u0664 \u2460 \uff11\uff12\uff13",
    "I'm can't we're they've he'll she'd it's",
    "DON'T SHOUT, YOU'RE LOUD, IT'S ME, WE'LL SEE, I'D GO, THEY'VE",
    "'sup ''s 'tis rock'n'roll o'clock",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 co\u00f6perate",
    "cafe\u0301 nai\u0308ve e\u0301te\u0301",
    "\u6211\u7231\u81ea\u7136\u8bed\u8a00\u5904\u7406\u3002\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff01",
    "\u6771\u4eac\u90fd\u6e0b\u8c37\u533a\u3067\u30e9\u30fc\u30e1\u30f3\u3092\u98df\u3079\u307e\u3057\u305f\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\ub3c4 \uc788\uc2b5\ub2c8\ub2e4.",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0417\u0438\u043c\u0430 \u0431\u044b\u043b\u0430 \u0445\u043e\u043b\u043e\u0434\u043d\u043e\u0439, "
    "\u043d\u043e \u043a\u043e\u0440\u043e\u0442\u043a\u043e\u0439.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u061f "
    "\u0647\u0630\u0627 \u0646\u0635 \u0639\u0631\u0628\u064a.",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e\u0964 "
    "\u092f\u0939 \u0939\u093f\u0902\u0926\u0940 \u0939\u0948\u0964",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "Hello \U0001F44B\U0001F3FD world \U0001F30D! \U0001F600\U0001F600",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 family, \U0001F1EF\U0001F1F5 flag, \u2764\ufe0f heart",
    "\U0001F525\U0001F525\U0001F525 fire x3 \U0001F680 to the moon",
    "<|im_start|>user\nIs this spam?<|im_end|>\n<|im_start|>assistant\nham<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
    "text<|endoftext|>more text<|endoftext|>",
    "partial <|im_start| <|im_end <im_start> |> <s <\\s>",
    "<tool_call>{\"name\": \"f\"}</tool_call> done",
    "I <think>maybe</think> think so <think> again",
    "left <mask> right<mask>x <mask>  [SEP] y [SEP]z",
    "word ### word###word ### end",
    " <s> leading special",
    "[INST]no space[/INST]tight [INST] spaced [/INST] ",
    "a <sep> b<sep>c <sep>",
    "Tab\tseparated\tvalues\t1\t2\t3",
    "semi;colon,comma;separated,list",
    "\u00c5ngstr\u00f6m \u212b K \u212a \ufb01 \ufb02 \u2460 \u33a1",
    "\uff28\uff45\uff4c\uff4c\uff4f \uff37\uff4f\uff52\uff4c\uff44",
    "ALL CAPS HEADLINE: MARKETS RALLY 3% ON NEWS",
    "snake_case_identifier and camelCaseIdentifier and kebab-case-id",
    "e.g. i.e. etc. vs. Mr. Dr. St.",
    "Wait... what?! (yes) [no] {maybe}; a-b_c/d\\e \"quoted\" 'single' -- ok.",
    "\u201csmart quotes\u201d and \u2018single\u2019 \u2014 em dash \u2013 en dash \u2026",
    "0x1F 0b1010 1e-9 -0.0 +inf NaN",
    "a1b2c3d4e5 x2y z9 99bottles",
]


def read_lines(path, encoding="utf-8"):
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")
    out = []
    for line in raw:
        try:
            out.append(line.decode(encoding))
        except UnicodeDecodeError:
            out.append(line.decode("latin-1"))  # a few SMS lines are Latin-1
    return out


def copy_corpus(source):
    """Copies the cooking excerpt used here from `source` (train.tsv, test.tsv) into the repository."""
    os.makedirs(CORPUS_DIR, exist_ok=True)
    with open(os.path.join(source, "train.tsv"), encoding="utf-8") as f:
        train = f.read().split("\n")[:3000]
    with open(os.path.join(source, "test.tsv"), encoding="utf-8") as f:
        test = f.read().split("\n")[:700]
    with open(COOKING, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(train + test) + "\n")
    print(f"wrote {COOKING}: {len(train)} train + {len(test)} test lines")


def cooking_lines():
    lines = [l for l in read_lines(COOKING) if l.strip()]
    # Drop the "__label__x " prefixes: only the question titles are text.
    titles = []
    for l in lines:
        words = l.split(" ")
        while words and words[0].startswith("__label__"):
            words.pop(0)
        titles.append(" ".join(words))
    return titles[:3000], titles[3000:]


def moby():
    with open(os.path.join(ROOT, "datasets", "moby-dick", "moby-dick.txt"), encoding="utf-8") as f:
        return f.read()


def sms(split):
    out = []
    for l in read_lines(os.path.join(ROOT, "datasets", "sms-spam", f"{split}.tsv")):
        if "\t" in l:
            out.append(l.split("\t", 1)[1])
    return out


def training_texts():
    text = moby()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    cook_train, _ = cooking_lines()
    return paragraphs + sms("train") + cook_train + HANDWRITTEN * 20


def test_lines():
    text = moby()
    lines = [l for l in text.split("\n") if l.strip()]
    step = max(1, len(lines) // 900)
    out = lines[::step][:900]
    # Multi-line passages (\n and \r\n), leading/trailing whitespace kept.
    raw_lines = text.split("\n")
    for k in range(60):
        start = 1000 + k * 331
        chunk = raw_lines[start:start + 4]
        out.append(("\r\n" if k % 3 == 0 else "\n").join(chunk))
    out += sms("test")
    _, cook_test = cooking_lines()
    out += cook_test[:650]
    out += HANDWRITTEN
    # Combinations: hand-written fragments joined with moby lines (specials inside prose).
    for k, h in enumerate(HANDWRITTEN):
        out.append(lines[(k * 97) % len(lines)] + " " + h)
        out.append(h + lines[(k * 53 + 7) % len(lines)])
    out += ["", "a", "\u00e9", "\U0001F600", "12", " 12", "  12", "x  \n  y"]
    return out


def byte_level_trainer(vocab_size):
    return trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                               special_tokens=[])


def added(content, special=True, normalized=False, lstrip=False, rstrip=False,
          single_word=False):
    return AddedToken(content, special=special, normalized=normalized, lstrip=lstrip,
                      rstrip=rstrip, single_word=single_word)


def write_folder(name, tok_json_text, config, template_file=None):
    d = os.path.join(HF_DIR, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(tok_json_text)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8",
              newline="\n") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    if template_file is not None:
        with open(os.path.join(d, "chat_template.jinja"), "w", encoding="utf-8",
                  newline="\n") as f:
            f.write(template_file)
    Tokenizer.from_file(os.path.join(d, "tokenizer.json"))  # loads
    return d


def make_llama3(texts):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.train_from_iterator(texts, byte_level_trainer(6000))
    # Like tiktoken-converted vocabularies (Llama 3), some tokens are whole words that the merges
    # do not rebuild: with ignore_merges such a word is one token, without it several.
    j = json.loads(tok.to_str())
    counts = {}
    for line in test_lines()[:1200]:
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(line):
            if piece not in j["model"]["vocab"] and len(tok.model.tokenize(piece)) >= 2:
                counts[piece] = counts.get(piece, 0) + 1
    extra = sorted(counts, key=lambda w: (-counts[w], w))[:64]
    for w in extra:
        j["model"]["vocab"][w] = len(j["model"]["vocab"])
    tok = Tokenizer.from_str(json.dumps(j))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|reserved_special_token_2|>", "<|eot_id|>"]
    tok.add_special_tokens([added(s) for s in specials])
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bot)])])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    text = json.dumps(j, ensure_ascii=False, indent=2)
    config = {
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False, "special": True}
            for s in specials},
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return write_folder("llama3", text, config)


def make_qwen2(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.train_from_iterator(texts, byte_level_trainer(5000))
    tok.add_special_tokens([added("<|endoftext|>"), added("<|im_start|>"), added("<|im_end|>")])
    tok.add_tokens([added("<tool_call>", special=False), added("</tool_call>", special=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    j = json.loads(tok.to_str())
    # Older tokenizers (< 0.20) wrote merges as "A B" strings; Qwen2's Hub file still does.
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    text = json.dumps(j, ensure_ascii=False, indent=2)
    config = {
        "add_prefix_space": False,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return write_folder("qwen2", text, config, template_file=CHATML_TEMPLATE)


def spm_model(texts):
    """SentencePiece-style BPE: <unk> <s> </s>, then <0x00>..<0xFF>, then the merges' tokens."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    # The 250 most frequent characters (ties by code point) are the alphabet: the others fall
    # back to bytes. Chosen here because the trainer's own limit_alphabet breaks ties at random.
    counts = {}
    for t in texts:
        for c in t.replace(" ", "\u2581"):
            counts[c] = counts.get(c, 0) + 1
    counts["\u2581"] = max(counts.values()) + 1
    alphabet = sorted(counts, key=lambda c: (-counts[c], c))[:250]
    trainer = trainers.BpeTrainer(vocab_size=5000, min_frequency=2, show_progress=False,
                                  limit_alphabet=len(alphabet), initial_alphabet=alphabet,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens)
    tok.train_from_iterator(texts, trainer)
    j = json.loads(tok.to_str())
    # The byte tokens are ordinary vocabulary entries in Llama 2, not added tokens.
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    return j


def spm_common(j, extra_added):
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([t for t in extra_added if t.special])
    tok.add_tokens([t for t in extra_added if not t.special])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def make_spm_legacy(j):
    j = json.loads(json.dumps(j))
    j["pre_tokenizer"] = None
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    tok = spm_common(j, [added("<|im_start|>"), added("<|im_end|>"),
                         added("<think>", special=False, normalized=True),
                         added("</think>", special=False, normalized=True)])
    text = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=2)
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "chat_template": [{"name": "default", "template": LLAMA2_TEMPLATE},
                          {"name": "chatml", "template": CHATML_TEMPLATE}],
        "clean_up_tokenization_spaces": False,
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "legacy": True,
        "model_max_length": 2048,
        "pad_token": None,
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": {"__type": "AddedToken", "content": "<unk>", "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
    }
    return write_folder("spm_legacy", text, config)


def make_spm_metaspace(j):
    j = json.loads(json.dumps(j))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
         "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    tok = spm_common(j, [added("[INST]", lstrip=True, rstrip=True),
                         added("[/INST]", lstrip=True, rstrip=False),
                         added("<sep>", special=False, single_word=True)])
    text = tok.to_str(pretty=False)
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "chat_template": LLAMA2_TEMPLATE,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 32768,
        "pad_token": "</s>",
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
    }
    return write_folder("spm_metaspace", text, config)


def make_spm_unk(j):
    j = json.loads(json.dumps(j))
    j["model"]["byte_fallback"] = False  # unknown characters become <unk>, runs fused
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "always", "split": True}
    j["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                    "split": True}
    tok = Tokenizer.from_str(json.dumps(j))
    text = tok.to_str(pretty=False)
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "tokenizer_class": "LlamaTokenizer"}
    return write_folder("spm_unk", text, config)


def make_misc(texts):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Replace(Regex(r"\t+"), "\t")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[!?]"), behavior="contiguous"),
        pre_tokenizers.Split(";", behavior="removed"),
        pre_tokenizers.Split(Regex(r"\p{Lu}"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[a-z]+"), behavior="merged_with_previous", invert=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)])
    tok.train_from_iterator(texts, byte_level_trainer(2000))
    tok.add_special_tokens([added("<pad>"), added("<mask>", lstrip=True),
                            added("[SEP]", rstrip=True)])
    tok.add_tokens([added("###", special=False, single_word=True, normalized=True),
                    added("\uff21\uff22", special=False, normalized=True)])  # NFKC: "AB"
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="$A [SEP]", pair="$A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[SEP]", tok.token_to_id("[SEP]"))])
    text = json.dumps(json.loads(tok.to_str()), ensure_ascii=False, indent=1)
    config = {"eos_token": "[SEP]", "pad_token": "<pad>", "model_max_length": 512,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    return write_folder("misc", text, config)


def make_smollm2():
    if not os.path.exists(os.path.join(GGUF_DIR, GGUF_FILE)):
        print(f"{GGUF_DIR}/{GGUF_FILE} absent: smollm2 folder not written")
        return None
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    d = os.path.join(HF_DIR, "smollm2")
    if os.path.isdir(d):
        shutil.rmtree(d)
    tok.save_pretrained(d)
    # Compact tokenizer.json (1.5 MB instead of 3.5 MB pretty-printed): same content.
    tok.backend_tokenizer.save(os.path.join(d, "tokenizer.json"), pretty=False)
    for extra in ("special_tokens_map.json",):
        p = os.path.join(d, extra)
        if os.path.exists(p):
            os.remove(p)
    return d


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--copy-corpus", metavar="DIR", default="",
                   help="copy the cooking excerpt from DIR (cooking-stackexchange/ of the "
                        "team's data: train.tsv, test.tsv) first")
    a = p.parse_args()
    if a.copy_corpus:
        copy_corpus(a.copy_corpus)
    elif not os.path.exists(COOKING):
        sys.exit(f"{COOKING} is missing: pass --copy-corpus=DIR")
    texts = training_texts()
    spm = spm_model(texts)
    dirs = {
        "llama3": make_llama3(texts),
        "qwen2": make_qwen2(texts),
        "spm_legacy": make_spm_legacy(spm),
        "spm_metaspace": make_spm_metaspace(spm),
        "spm_unk": make_spm_unk(spm),
        "misc": make_misc(texts),
    }
    smol = make_smollm2()
    if smol:
        dirs["smollm2"] = smol
    lines = test_lines()
    families = {}
    for name, d in dirs.items():
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        ids, decoded = [], {}
        for i, line in enumerate(lines):
            e = tok.encode(line, add_special_tokens=False).ids
            ids.append(e)
            text = tok.decode(e, skip_special_tokens=False)
            if text != line:
                decoded[str(i)] = text
        families[name] = {
            "dir": os.path.relpath(d, ROOT),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "with_bos": tok.encode("Hi", add_special_tokens=True).ids[:1] !=
                        tok.encode("Hi", add_special_tokens=False).ids[:1],
            "ids": ids,
            "decoded_if_different": decoded,
        }
        print(f"{name}: vocab {families[name]['vocab_size']}, {len(lines)} lines, "
              f"{len(decoded)} do not decode to themselves, "
              f"tokenizer.json {os.path.getsize(os.path.join(d, 'tokenizer.json'))} bytes")
    data = {
        "generator": "tests/oracle/make_hf_tokenizer_oracle.py",
        "versions": {"tokenizers": importlib.metadata.version("tokenizers"),
                     "transformers": importlib.metadata.version("transformers")},
        "lines": lines,
        "families": families,
    }
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
