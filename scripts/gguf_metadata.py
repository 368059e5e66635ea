"""GGUF metadata without the tensors, for scripts/device_check.py: the device runs read the
tokenizer of a GGUF model from a copy that holds its header and key/value metadata only
(GGUF v2/v3 layout: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).

  tokenizer_gguf(src, dst)   writes dst: src's header and metadata, zero tensors
"""
import os
import struct


_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


def _gguf_skip_value(buf, pos, vtype):
    """Returns the offset just past one GGUF value of type `vtype` starting at `pos`."""
    if vtype in _GGUF_SCALAR:
        return pos + _GGUF_SCALAR[vtype]
    if vtype == _GGUF_STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == _GGUF_ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _GGUF_SCALAR:
            return pos + count * _GGUF_SCALAR[etype]
        for _ in range(count):
            pos = _gguf_skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype} at offset {pos}")


def tokenizer_gguf(src, dst):
    """Writes `dst`: `src`'s GGUF header and key/value metadata with zero tensors."""
    with open(src, "rb") as f:
        head = f.read(64 << 20)  # metadata of a Llama GGUF is a few MB
    if head[:4] != b"GGUF":
        raise ValueError(f"{src} is not a GGUF file")
    version, _, kv_count = struct.unpack_from("<IQQ", head, 4)
    if version < 2:
        raise ValueError(f"{src}: GGUF version {version} is not supported (need 2 or 3)")
    pos = 24
    alignment = 32
    for _ in range(kv_count):
        (klen,) = struct.unpack_from("<Q", head, pos)
        key = head[pos + 8:pos + 8 + klen].decode("utf-8")
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", head, pos)
        if key == "general.alignment" and vtype == _GGUF_UINT32:
            (alignment,) = struct.unpack_from("<I", head, pos + 4)
        pos = _gguf_skip_value(head, pos + 4, vtype)
        if pos > len(head):
            raise ValueError(f"{src}: metadata larger than {len(head)} bytes")
    out = bytearray(head[:4]) + struct.pack("<IQQ", version, 0, kv_count) + head[24:pos]
    out += b"\0" * ((-len(out)) % alignment)  # empty, aligned tensor-data section
    tmp = dst + ".partial"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, dst)
    print(f"device_check: wrote {dst} ({len(out)} bytes, {kv_count} metadata keys, no tensors)")


