"""Training data as the JSONL a job reads (docs/data.md), from a `datasets.Dataset`, a parquet
file, ShareGPT records or any iterable of dicts.

Each output line is one of the record shapes the worker's reader accepts, with only its keys:

| shape | line | from records with |
|---|---|---|
| chat | {"messages": [{"role", "content"}, ...]} | "messages", or ShareGPT's "conversations" |
| alpaca | {"instruction", "input"?, "output"} | "instruction" |
| prompt_completion | {"prompt", "completion"} (strings, or lists of messages) | "prompt" + "completion" |
| classification | {"label", "text"} | "label" + "text" |

ShareGPT records ({"conversations": [{"from": "human" | "gpt" | "system", "value"}, ...]},
optionally a top-level "system" prompt) become chat records with the roles user / assistant /
system. One file holds one shape: the job detects the format from its first record (unless
the spec sets data.format), so a source whose records have different shapes is refused.
Plain text (records with only "text") is a corpus, not JSONL: write_text() writes it.
"""
import json
import os
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from lspo.errors import LspoError

#: ShareGPT's speaker names ("from") and the chat roles they become: Axolotl's default role
#: map, the one the C++ reader of "conversations" records uses too (data/sft.h). Extend it
#: with the `roles` argument (e.g. {"bing": "assistant"}).
SHAREGPT_ROLES: Dict[str, str] = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "model": "assistant", "system": "system",
}
#: The shapes to_jsonl writes (its `format` argument; "sharegpt" reads ShareGPT, writes chat).
FORMATS = ("chat", "sharegpt", "alpaca", "prompt_completion", "classification")
_CHAT_ROLES = ("system", "user", "assistant")

Record = Mapping[str, Any]
Source = Union[Iterable[Record], str, "os.PathLike[str]"]


def detect_format(record: Record) -> Optional[str]:
    """The shape of one record by its keys, in the order the worker's reader tries them
    ("sharegpt" for ShareGPT's "conversations"); None when it matches none."""
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        return "chat"
    if "instruction" in record:
        return "alpaca"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "label" in record and "text" in record:
        return "classification"
    return None


def _string(record: Record, key: str, where: str) -> str:
    """record[key], which must be a string (LspoError naming `where` and `key` otherwise)."""
    value = record.get(key)
    if not isinstance(value, str):
        got = "missing" if key not in record else f"a {type(value).__name__}"
        raise LspoError(f"{where}: \"{key}\" must be a string ({got})")
    return value


def _messages(turns: Any, where: str) -> List[Dict[str, str]]:
    """A validated list of {"role", "content"} (only those keys) from chat messages."""
    if not isinstance(turns, (list, tuple)) or not turns:
        raise LspoError(f"{where}: expected a non-empty list of {{\"role\", \"content\"}}")
    out = []
    for k, m in enumerate(turns):
        at = f"{where}[{k}]"
        if not isinstance(m, Mapping):
            raise LspoError(f"{at}: expected an object {{\"role\", \"content\"}}")
        role = _string(m, "role", at)
        content = _string(m, "content", at)
        if role not in _CHAT_ROLES:
            raise LspoError(f"{at}: role \"{role}\"; supported roles: {', '.join(_CHAT_ROLES)}")
        out.append({"role": role, "content": content})
    return out


def sharegpt_to_chat(record: Record, *, roles: Optional[Mapping[str, str]] = None,
                     where: str = "record") -> Dict[str, Any]:
    """One ShareGPT record as a chat record {"messages": [...]}.

    Each turn {"from": F, "value": V} becomes {"role": SHAREGPT_ROLES[F], "content": V}
    (`roles` adds to or replaces SHAREGPT_ROLES); a top-level string "system" that is not
    empty becomes a first system turn (when the conversation has none).

    Raises LspoError naming `where`, the turn and the fix for a missing or empty
    "conversations", a turn without string "from" / "value", or an unknown speaker.
    """
    names = dict(SHAREGPT_ROLES, **(roles or {}))
    turns = record.get("conversations")
    if not isinstance(turns, (list, tuple)) or not turns:
        raise LspoError(f"{where}: \"conversations\" must be a non-empty list of "
                        "{\"from\", \"value\"} turns")
    messages = []
    for k, t in enumerate(turns):
        at = f"{where}: conversations[{k}]"
        if not isinstance(t, Mapping):
            raise LspoError(f"{at}: expected an object {{\"from\", \"value\"}}")
        speaker = _string(t, "from", at)
        value = _string(t, "value", at)
        if speaker not in names or names[speaker] not in _CHAT_ROLES:
            raise LspoError(
                f"{at}: speaker \"{speaker}\" has no chat role; known: "
                f"{', '.join(sorted(names))} (pass roles={{\"{speaker}\": \"assistant\"}} or "
                "\"user\" to map it)")
        messages.append({"role": names[speaker], "content": value})
    system = record.get("system")
    if isinstance(system, str) and system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return {"messages": messages}


def to_record(record: Record, fmt: str, *, roles: Optional[Mapping[str, str]] = None,
              label_names: Optional[Sequence[str]] = None,
              where: str = "record") -> Dict[str, Any]:
    """One record in the JSONL shape `fmt` (one of FORMATS), with only that shape's keys.

    `label_names` turns an integer classification label into its name (a datasets ClassLabel's
    names); other integer labels are written as their decimal text.

    Raises LspoError naming `where` and the field for a missing or ill-typed field.
    """
    if not isinstance(record, Mapping):
        raise LspoError(f"{where}: expected an object, got a {type(record).__name__}")
    if fmt == "sharegpt":
        return sharegpt_to_chat(record, roles=roles, where=where)
    if fmt == "chat":
        return {"messages": _messages(record.get("messages"), f"{where}: messages")}
    if fmt == "alpaca":
        out = {"instruction": _string(record, "instruction", where)}
        if record.get("input") is not None:
            out["input"] = _string(record, "input", where)
        out["output"] = _string(record, "output", where)
        return out
    if fmt == "prompt_completion":
        p, c = record.get("prompt"), record.get("completion")
        if isinstance(p, str) and isinstance(c, str):
            return {"prompt": p, "completion": c}
        if isinstance(p, (list, tuple)) and isinstance(c, (list, tuple)):
            completion = _messages(c, f"{where}: completion")
            if any(m["role"] != "assistant" for m in completion):
                raise LspoError(f"{where}: a completion holds assistant turns only")
            return {"prompt": _messages(p, f"{where}: prompt"), "completion": completion}
        raise LspoError(f"{where}: \"prompt\" and \"completion\" must both be strings or both "
                        "lists of messages")
    if fmt == "classification":
        label = record.get("label")
        if isinstance(label, int) and not isinstance(label, bool):
            label = label_names[label] if label_names and 0 <= label < len(label_names) \
                else str(label)
        if not isinstance(label, str) or not label:
            raise LspoError(f"{where}: \"label\" must be a non-empty string or an integer")
        return {"label": label, "text": _string(record, "text", where)}
    raise ValueError(f"format '{fmt}': use auto or one of {', '.join(FORMATS)}")


def _shape(fmt: str) -> str:
    return "chat" if fmt == "sharegpt" else fmt


def convert(records: Iterable[Record], *, format: str = "auto",
            roles: Optional[Mapping[str, str]] = None,
            label_names: Optional[Sequence[str]] = None) -> Iterator[Dict[str, Any]]:
    """Yields `records` as JSONL records of one shape (to_record), the shape given by
    `format` or, with "auto", detected from the first record (detect_format).

    Raises LspoError naming the record (0-based) whose keys match no shape, or whose shape
    differs from the first record's.
    """
    fmt = None if format == "auto" else format
    first = None
    for k, record in enumerate(records):
        where = f"record {k}"
        this = fmt
        if this is None:
            if not isinstance(record, Mapping):
                raise LspoError(f"{where}: expected an object, got a {type(record).__name__}")
            this = detect_format(record)
            if this is None:
                text_only = "text" in record and "label" not in record
                raise LspoError(
                    f"{where} has the keys {sorted(record)}: none of the shapes a job reads "
                    "(conversations = ShareGPT, messages = chat, instruction = alpaca, prompt + "
                    "completion, label + text = classification)" +
                    ("; text alone is a plain-text corpus: use write_text()" if text_only
                     else "; rename the columns, or pass format="))
            if first is None:
                first = this
            elif _shape(this) != _shape(first):
                raise LspoError(f"{where} is {_shape(this)} but record 0 is {_shape(first)}: "
                                "one file holds one shape")
        yield to_record(record, this, roles=roles, label_names=label_names, where=where)


def _parquet_file(path: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise LspoError("reading parquet needs pyarrow: pip install pyarrow "
                        "(or pip install './python[parquet]')") from e
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise LspoError(f"parquet file '{path}': {e}") from e


def parquet_label_names(path: Union[str, "os.PathLike[str]"]) -> Optional[List[str]]:
    """The class names of the "label" column of a parquet file written by the datasets
    package (a ClassLabel in the schema's "huggingface" metadata); None when it has none."""
    meta = _parquet_file(os.fspath(path)).schema_arrow.metadata or {}
    try:
        info = json.loads(meta.get(b"huggingface", b"{}"))
        label = info.get("info", {}).get("features", {}).get("label", {})
        names = label.get("names") if isinstance(label, dict) else None
        return list(names) if isinstance(names, list) else None
    except (ValueError, AttributeError):
        return None


def read_parquet(path: Union[str, "os.PathLike[str]"], *,
                 batch_size: int = 1024) -> Iterator[Dict[str, Any]]:
    """Yields the rows of a parquet file as dicts (column name -> Python value), reading
    `batch_size` rows at a time. Needs pyarrow.

    Raises LspoError when pyarrow is not installed or the file cannot be read.
    """
    f = _parquet_file(os.fspath(path))
    for batch in f.iter_batches(batch_size=batch_size):
        yield from batch.to_pylist()


def _records_and_names(source: Source) -> "tuple[Iterable[Record], Optional[List[str]]]":
    """The records of `source` and the class names of its labels, if it carries them."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not path.endswith(".parquet"):
            raise LspoError(f"'{path}': give a .parquet file, or an iterable of dicts")
        return read_parquet(path), parquet_label_names(path)
    features = getattr(source, "features", None)  # a datasets.Dataset, duck-typed
    label = features.get("label") if isinstance(features, Mapping) else None
    names = getattr(label, "names", None)
    return source, (list(names) if isinstance(names, (list, tuple)) else None)


def to_jsonl(source: Source, path: Union[str, "os.PathLike[str]"], *, format: str = "auto",
             roles: Optional[Mapping[str, str]] = None,
             label_names: Optional[Sequence[str]] = None) -> int:
    """Writes `source` as a JSONL file a job reads (data.train_path / data.eval_path).

    Args:
        source: a `datasets.Dataset` (or anything iterable of dicts: a list, a generator,
            pandas' `df.to_dict("records")`), or the path of a .parquet file (needs pyarrow).
        path: the file to write (replaced; written to PATH.partial first, renamed at the end).
        format: "auto" (from the first record's keys) or one of FORMATS.
        roles: more ShareGPT speaker names (sharegpt_to_chat).
        label_names: names of integer labels (default: a Dataset's ClassLabel "label" names,
            or those a parquet file written by datasets records).
    Returns:
        the number of lines written.
    Raises:
        LspoError: a record that matches no shape, differs from the first record's shape, or
            lacks a field (named with its 0-based index); a source with no records; a parquet
            file that cannot be read, or no pyarrow.
    """
    records, names = _records_and_names(source)
    out = os.fspath(path)
    tmp = out + ".partial"
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for record in convert(records, format=format, roles=roles,
                                  label_names=label_names if label_names is not None else names):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n += 1
        if n == 0:
            raise LspoError(f"no records to write to {out}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return n


def write_text(source: Source, path: Union[str, "os.PathLike[str]"], *, column: str = "text",
               separator: str = "\n\n") -> int:
    """Writes the `column` of every record as a plain-text corpus (data.format: text), the
    records joined by `separator`. Returns the number of records written.

    Raises LspoError for a record whose `column` is not a string.
    """
    records, _ = _records_and_names(source)
    n = 0
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        for k, record in enumerate(records):
            text = _string(record, column, f"record {k}")
            f.write((separator if n else "") + text)
            n += 1
        if n:
            f.write("\n")
    return n


__all__ = ["to_jsonl", "write_text", "convert", "to_record", "sharegpt_to_chat",
           "detect_format", "read_parquet", "parquet_label_names", "SHAREGPT_ROLES", "FORMATS"]
