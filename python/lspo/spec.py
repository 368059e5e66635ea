"""Job specs: from a dict, a YAML/JSON file or text to the JobSpec message the scheduler takes.

The scheduler's SubmitJob takes a parsed JobSpec (proto/scheduler.proto); reading a spec file
is the client's work, and lspctl does it with the C++ spec library (spec/job_spec.h): the
proto field names, their JSON names, short enum names ("lsp", "overlap"), the transformers /
TRL / Axolotl aliases (learning_rate, max_steps, ...: docs/spec.md), KEY=VALUE overrides and
every unknown key reported at once. So that a spec means here what it means to lspctl,
load_spec() has two readers:

- "lspctl": lspctl itself reads the spec (`lspctl spec` prints the JobSpec it read as JSON).
  Everything lspctl accepts is accepted, with lspctl's messages.
- "python": this package reads it: YAML or JSON, proto or JSON field names, short or full
  enum names and KEY=VALUE overrides of field paths; the aliases are refused with the list
  of keys it does not know (they are lspctl's: give it lspctl).

"auto" (the default) uses lspctl when find_lspctl() finds one, else the Python reader.
"""
import contextlib
import copy
import json
import os
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import grpc
import yaml
from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format

from lspo._proto import job_spec_pb2
from lspo.errors import LspoError

JobSpec = job_spec_pb2.JobSpec
#: A job spec as the functions of this package take it: a JobSpec message, a dict (the YAML
#: file's tree), a path to a .yaml / .yml / .json file, or YAML / JSON text.
SpecLike = Union[JobSpec, Mapping[str, Any], str, "os.PathLike[str]"]
#: Spec overrides: "key=value" strings (value read as YAML) or a {key: value} mapping.
Overrides = Union[Sequence[str], Mapping[str, Any]]

_BAD_SPEC = grpc.StatusCode.INVALID_ARGUMENT


def override_args(overrides: Overrides) -> List[str]:
    """`overrides` as lspctl's KEY=VALUE arguments (a mapping's values written as JSON,
    which lspctl reads as YAML)."""
    if isinstance(overrides, Mapping):
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: a sequence of 'key=value' strings or a mapping, not a str")
    return list(overrides)


def _looks_like_text(s: str) -> bool:
    """Whether `s` is spec text rather than a file name."""
    return "\n" in s or s.lstrip().startswith("{") or ": " in s or s.rstrip().endswith(":")


def _text_and_name(spec: Union[str, "os.PathLike[str]"]) -> "tuple[str, str]":
    """(the spec's text, the name errors give it) of a path or of spec text."""
    s = os.fspath(spec)
    if isinstance(spec, str) and not os.path.exists(s) and _looks_like_text(s):
        return s, "<text>"
    try:
        with open(s, encoding="utf-8") as f:
            return f.read(), s
    except OSError as e:
        raise LspoError(f"job spec file '{s}': {e.strerror}", _BAD_SPEC) from e


def spec_tree(spec: SpecLike) -> Dict[str, Any]:
    """The spec as a tree of dicts and lists (what its YAML or JSON holds; a JobSpec as
    protobuf's JSON mapping with proto field names). Reads files; resolves no alias.

    Raises LspoError (INVALID_ARGUMENT) for a file that cannot be read, text that is not YAML
    or JSON, or a top level that is not a mapping.
    """
    if isinstance(spec, JobSpec):
        return json_format.MessageToDict(spec, preserving_proto_field_name=True)
    if isinstance(spec, Mapping):
        return copy.deepcopy(dict(spec))
    text, name = _text_and_name(spec)
    try:
        tree = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as e:
        raise LspoError(f"job spec {name} is not valid YAML or JSON: {e}", _BAD_SPEC) from e
    if not isinstance(tree, dict):
        raise LspoError(f"job spec {name}: expected a mapping at the top level", _BAD_SPEC)
    return tree


@contextlib.contextmanager
def spec_file(spec: SpecLike) -> Iterator[str]:
    """A path to a file holding `spec`, for lspctl's --spec: the file itself when `spec` names
    one, else a temporary .json / .yaml file removed on exit."""
    if isinstance(spec, (str, os.PathLike)):
        s = os.fspath(spec)
        if not (isinstance(spec, str) and not os.path.exists(s) and _looks_like_text(s)):
            yield s
            return
        suffix, text = (".json" if s.lstrip().startswith("{") else ".yaml"), s
    elif isinstance(spec, JobSpec):
        suffix, text = ".json", json_format.MessageToJson(spec, preserving_proto_field_name=True)
    else:
        suffix, text = ".json", json.dumps(dict(spec))
    fd, path = tempfile.mkstemp(prefix="lspo-spec-", suffix=suffix)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        yield path
    finally:
        os.unlink(path)


# ---- The Python reader ---------------------------------------------------------------------


def _field(d: _descriptor.Descriptor, key: str) -> Optional[_descriptor.FieldDescriptor]:
    """The field of `d` named `key` (proto name or JSON name)."""
    f = d.fields_by_name.get(key)
    if f is not None:
        return f
    for f in d.fields:
        if f.json_name == key:
            return f
    return None


def _repeated(f: _descriptor.FieldDescriptor) -> bool:
    return bool(f.label == f.LABEL_REPEATED)  # type: ignore[attr-defined]


def _is_map(f: _descriptor.FieldDescriptor) -> bool:
    m = f.message_type
    return m is not None and m.GetOptions().map_entry


def _enum_prefix(e: _descriptor.EnumDescriptor) -> str:
    """"MODE" when every value is MODE_* and value 0 is MODE_UNSPECIFIED; "" otherwise (then
    the enum has no short names: runtime/proto_json.h)."""
    zero = e.values_by_number.get(0)
    if zero is None or not zero.name.endswith("_UNSPECIFIED"):
        return ""
    prefix = zero.name[: -len("_UNSPECIFIED")]
    return prefix if all(v.name.startswith(prefix + "_") for v in e.values) else ""


def _full_enum_name(e: _descriptor.EnumDescriptor, value: Any) -> Any:
    """The full name of `value` given by its short name ("lsp", "tiny-random", any case);
    anything else is returned as it is (protobuf's parser then judges it)."""
    prefix = _enum_prefix(e)
    if not isinstance(value, str) or not prefix or value in e.values_by_name:
        return value
    if value == "":
        return e.values_by_number[0].name
    full = prefix + "_" + value.upper().replace("-", "_")
    return full if full in e.values_by_name else value


def _normalize(d: _descriptor.Descriptor, tree: Any, where: str, unknown: List[str]) -> Any:
    """`tree` with short enum names made full, the unknown keys of `d` appended to
    `unknown` (dotted paths)."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        f = _field(d, str(key))
        path = f"{where}{key}"
        if f is None:
            unknown.append(path)
            continue
        many = _repeated(f) and isinstance(value, list)
        items = value if many else [value]
        if f.message_type is not None and not _is_map(f):
            items = [_normalize(f.message_type, v, path + ".", unknown) for v in items]
        elif f.enum_type is not None:
            items = [_full_enum_name(f.enum_type, v) for v in items]
        out[key] = items if many else items[0]
    return out


def _set_path(tree: Dict[str, Any], item: str) -> None:
    """Applies one KEY=VALUE override (a dotted field path; VALUE read as YAML) to `tree`."""
    key, eq, raw = item.partition("=")
    if not eq or not key:
        raise LspoError(f"override '{item}': expected KEY=VALUE", _BAD_SPEC)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise LspoError(f"override '{item}': the value is not valid YAML: {e}", _BAD_SPEC) from e
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value
    # A length given as an override replaces the spec's, in steps or in epochs (as lspctl).
    if key == "steps":
        tree.pop("epochs", None)
    elif key == "epochs":
        tree.pop("steps", None)


def parse_spec(spec: SpecLike, overrides: Overrides = ()) -> JobSpec:
    """The Python reader: `spec` (see SpecLike) and `overrides` (field paths only) as a
    JobSpec, without lspctl.

    Raises LspoError (INVALID_ARGUMENT) naming every key that is not a JobSpec field (aliases
    such as learning_rate among them: those need lspctl, see load_spec), or a bad value.
    """
    tree = spec_tree(spec)
    for item in override_args(overrides):
        _set_path(tree, item)
    unknown: List[str] = []
    tree = _normalize(JobSpec.DESCRIPTOR, tree, "", unknown)  # type: ignore[arg-type]
    if unknown:
        raise LspoError(
            f"job spec: {len(unknown)} unknown field{'s' if len(unknown) > 1 else ''}: "
            f"{', '.join(repr(k) for k in unknown)}. This package's own reader knows the "
            "JobSpec fields (proto/job_spec.proto); the transformers / TRL / Axolotl aliases "
            "(learning_rate, max_steps, ...: docs/spec.md) are read by lspctl: pass lspctl=PATH "
            "or set LSPO_LSPCTL", _BAD_SPEC)
    try:
        return json_format.ParseDict(tree, JobSpec())
    except json_format.ParseError as e:
        raise LspoError(f"job spec: {e}", _BAD_SPEC) from e


# ---- lspctl as the reader ------------------------------------------------------------------


def parse_spec_with_lspctl(spec: SpecLike, overrides: Overrides = (), *,
                           lspctl: Optional[str] = None, cwd: Optional[str] = None,
                           timeout: float = 120.0) -> JobSpec:
    """`spec` and `overrides` read by lspctl exactly as `lspctl submit` reads them (aliases,
    short names, overrides, lspctl's checks and messages): `lspctl spec` prints the JobSpec it
    read as JSON (proto field names, short enum names), parsed here.

    Raises LspoError (INVALID_ARGUMENT) with lspctl's message when it refuses the spec, or
    when lspctl cannot be found or run.
    """
    import subprocess

    from lspo.lspctl import find_lspctl  # lspctl.py imports this module

    exe = find_lspctl(lspctl)
    try:
        with spec_file(spec) as path:
            out = subprocess.run([exe, "spec", f"--spec={path}", *override_args(overrides)],
                                 cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LspoError(f"lspctl did not read the spec within {timeout} s") from e
    if out.returncode != 0:
        lines = [ln[len("lspctl: "):] for ln in out.stderr.splitlines()
                 if ln.startswith("lspctl: ")]
        msg = "; ".join(lines) or out.stderr.strip() or f"lspctl exited {out.returncode}"
        if not isinstance(spec, (str, os.PathLike)) or path != os.fspath(spec):
            msg = msg.replace(path, "<the given spec>")  # a temporary file: name no path
        raise LspoError(msg, _BAD_SPEC)
    unknown: List[str] = []
    tree = _normalize(JobSpec.DESCRIPTOR, json.loads(out.stdout), "",  # type: ignore[arg-type]
                      unknown)
    if unknown:  # an lspctl newer than these stubs
        raise LspoError(f"lspctl's spec has fields this package does not know: {unknown}; "
                        "reinstall the package from the same checkout", _BAD_SPEC)
    spec_read: JobSpec = json_format.ParseDict(tree, JobSpec())
    return spec_read


def load_spec(spec: SpecLike, overrides: Overrides = (), *, reader: str = "auto",
              lspctl: Optional[str] = None, cwd: Optional[str] = None) -> JobSpec:
    """`spec` (see SpecLike) with `overrides` applied, as the JobSpec to submit.

    Args:
        spec: a JobSpec (returned as it is when there are no overrides), a dict, a file path,
            or YAML / JSON text.
        overrides: KEY=VALUE overrides ("optim.lr=3e-4", "max_steps=2") or a mapping.
        reader: "lspctl", "python" or "auto" (lspctl when found: module docstring).
        lspctl: the lspctl binary for the "lspctl" reader (find_lspctl's search when None).
        cwd: lspctl's working folder (relative spec file names resolve against it).
    Relative paths inside the spec are not resolved here: the scheduler resolves them against
    its own working folder.
    Raises:
        LspoError: INVALID_ARGUMENT for a spec that cannot be read, or no lspctl for
            reader="lspctl".
        ValueError: an unknown `reader`.
    """
    if isinstance(spec, JobSpec) and not overrides:
        return spec
    if cwd and isinstance(spec, (str, os.PathLike)) and not os.path.isabs(os.fspath(spec)):
        candidate = os.path.join(cwd, os.fspath(spec))
        if os.path.exists(candidate):  # a file name relative to cwd, as lspctl would read it
            spec = candidate
    if reader not in ("auto", "lspctl", "python"):
        raise ValueError(f"reader='{reader}': use auto, lspctl or python")
    if reader == "auto":
        from lspo.lspctl import find_lspctl

        lspctl = find_lspctl(lspctl, required=False)
        reader = "lspctl" if lspctl else "python"
    if reader == "python":
        return parse_spec(spec, overrides)
    return parse_spec_with_lspctl(spec, overrides, lspctl=lspctl, cwd=cwd)


__all__ = ["JobSpec", "SpecLike", "Overrides", "load_spec", "parse_spec",
           "parse_spec_with_lspctl", "spec_tree", "spec_file", "override_args"]
