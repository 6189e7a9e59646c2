"""A minimal safetensors reader/writer (no `safetensors` package on this machine).

File layout: 8-byte little-endian u64 N; N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the first byte after the
header) plus an optional "__metadata__" string map; then the raw little-endian tensor data.

Only the dtypes a DeepSeek-V3.2 checkpoint uses are decoded: F32, BF16, F8_E4M3 (plus F16,
I32, I64 for convenience). Values are returned as float32 numpy arrays; bf16 is widened by
placing its 16 bits on top of an fp32, e4m3 by a 256-entry table, both exact.
"""
import json
import mmap
import os
import struct

import numpy as np

import ds32_numerics as nx

_E4M3_NP = nx.E4M3_TABLE.numpy()

_ITEMSIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1}


class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack("<Q", self._mm[:8])
        if n > len(self._mm) - 8:
            raise ValueError(f"{path}: header length {n} beyond end of file")
        header = json.loads(self._mm[8:8 + n].decode("utf-8"))
        self.metadata = header.pop("__metadata__", None)
        self.entries = header
        self._data_start = 8 + n
        for name, e in header.items():
            if e["dtype"] not in _ITEMSIZE:
                continue  # unknown dtypes are only an error if someone reads them
            b, end = e["data_offsets"]
            numel = int(np.prod(e["shape"], dtype=np.int64))
            if end - b != numel * _ITEMSIZE[e["dtype"]] or self._data_start + end > len(self._mm):
                raise ValueError(f"{path}: bad data_offsets for {name}")

    def keys(self):
        return self.entries.keys()

    def dtype(self, name):
        return self.entries[name]["dtype"]

    def raw(self, name):
        """The stored bytes of a tensor as a numpy array of its storage type."""
        e = self.entries[name]
        b, end = e["data_offsets"]
        buf = self._mm[self._data_start + b:self._data_start + end]
        dt = e["dtype"]
        np_dt = {"F32": "<f4", "BF16": "<u2", "F16": "<f2", "F8_E4M3": "u1", "I32": "<i4",
                 "I64": "<i8", "U8": "u1"}.get(dt)
        if np_dt is None:
            raise ValueError(f"{self.path}: unsupported dtype {dt} for {name}")
        return np.frombuffer(buf, dtype=np_dt).reshape(e["shape"])

    def get_f32(self, name):
        """Tensor values widened (exactly) to float32."""
        dt = self.dtype(name)
        r = self.raw(name)
        if dt == "F32":
            return r.astype(np.float32)
        if dt == "BF16":
            return (r.astype(np.uint32) << 16).view(np.float32)
        if dt == "F16":
            return r.astype(np.float32)
        if dt == "F8_E4M3":
            return _E4M3_NP[r]
        return r.astype(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> (dtype string, numpy array of the storage type: float32 for F32,
    uint16 for BF16, uint8 for F8_E4M3). Written in insertion order."""
    header = {}
    chunks = []
    off = 0
    for name, (dt, arr) in tensors.items():
        data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        assert len(data) == arr.size * _ITEMSIZE[dt], (name, dt, arr.dtype)
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    if metadata is not None:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for c in chunks:
            f.write(c)


class Checkpoint:
    """A Hugging Face model directory: model.safetensors.index.json (weight_map) or a single
    model.safetensors (or any *.safetensors files)."""

    def __init__(self, model_dir):
        self.dir = model_dir
        self._files = {}
        self.weight_map = {}
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                self.weight_map = dict(json.load(f)["weight_map"])
        else:
            names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
            if not names:
                raise FileNotFoundError(f"{model_dir}: no safetensors files")
            for fn in names:
                for k in self._file(fn).keys():
                    self.weight_map[k] = fn

    def _file(self, fn):
        if fn not in self._files:
            self._files[fn] = SafetensorsFile(os.path.join(self.dir, fn))
        return self._files[fn]

    def __contains__(self, name):
        return name in self.weight_map

    def dtype(self, name):
        return self._file(self.weight_map[name]).dtype(name)

    def get_f32(self, name):
        return self._file(self.weight_map[name]).get_f32(name)
