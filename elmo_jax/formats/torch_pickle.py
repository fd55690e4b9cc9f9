"""Read the tensors of a `torch.save`d state dict without torch.

Both of torch's formats:

    legacy (torch < 1.6, the released 2018 models): five pickles in a row (magic
        number, protocol version, system info, the object, the storage keys),
        then each storage's bytes after an int64 element count;
    zip (torch >= 1.6): a zip archive of `PREFIX/data.pkl` and one file
        `PREFIX/data/KEY` per storage.

The object pickle names tensors through persistent ids
`("storage", StorageType, key, location, numel[, view])` and rebuilds them with
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`. The
unpickler here knows those names and `collections.OrderedDict`, and refuses
every other class: a pickle cannot run code here.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np

from elmo_jax.errors import MissingFile, UserError

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class TorchPickleError(UserError, ValueError):
    """A file that is not a torch state dict this reader can take; names the file."""


class _StorageType:
    def __init__(self, name: str):
        self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name])


class _Tensor:
    """A tensor to be cut from its storage once the storages are read."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _rebuild_tensor(storage, storage_offset, size, stride, *_):
    return _Tensor(storage, int(storage_offset), tuple(size), tuple(stride))


class _Unpickler(pickle.Unpickler):
    def __init__(self, fh, path: str):
        super().__init__(fh)
        self.path = path
        self.storages: dict[str, tuple[_StorageType, int]] = {}

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise TorchPickleError(f"{self.path}: the pickle asks for {module}.{name}, which a "
                               "state dict of tensors does not hold; refused")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise TorchPickleError(f"{self.path}: unknown persistent id {pid!r}")
        _, kind, key, _location, numel = pid[:5]
        self.storages[str(key)] = (kind, int(numel))
        return str(key)


def load_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """{name: numpy array} of a `torch.save`d state dict, either format."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFile(f"torch file not found: {path}")
    try:
        if zipfile.is_zipfile(path):
            obj, storages = _load_zip(path)
        else:
            with open(path, "rb") as fh:
                obj, storages = _load_legacy(fh, path)
    except (pickle.UnpicklingError, EOFError, struct.error, zipfile.BadZipFile, KeyError) as e:
        raise TorchPickleError(f"{path}: not a readable torch state dict, or truncated "
                               f"({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise TorchPickleError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    out = {}
    for name, t in obj.items():
        if not isinstance(t, _Tensor):
            raise TorchPickleError(f"{path}: entry {name!r} is not a tensor")
        out[str(name)] = _cut(t, storages[t.storage], path, name)
    return out


def _cut(t: _Tensor, storage: np.ndarray, path: str, name: str) -> np.ndarray:
    last = t.offset + sum((n - 1) * s for n, s in zip(t.size, t.stride) if n > 0)
    if any(n == 0 for n in t.size):
        return np.zeros(t.size, storage.dtype)
    if t.offset < 0 or last >= storage.size:
        raise TorchPickleError(f"{path}: tensor {name!r} reaches past its storage "
                               f"({last + 1} > {storage.size} elements): the file is damaged")
    item = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(storage[t.offset:], shape=t.size,
                                           strides=[s * item for s in t.stride])
    return np.array(view)


def _load_legacy(fh, path: str):
    magic = pickle.load(fh)
    if magic != LEGACY_MAGIC:
        raise TorchPickleError(f"{path}: not a torch file (no torch magic number)")
    pickle.load(fh)  # protocol version
    info = pickle.load(fh)
    if isinstance(info, dict) and not info.get("little_endian", True):
        raise TorchPickleError(f"{path}: written big-endian, which this reader does not take")
    unpickler = _Unpickler(fh, path)
    obj = unpickler.load()
    keys = pickle.load(fh)
    storages = {}
    for key in keys:
        kind, numel = unpickler.storages[str(key)]
        (count,) = struct.unpack("<q", _read(fh, 8, path))
        data = _read(fh, count * kind.dtype.itemsize, path)
        storages[str(key)] = np.frombuffer(data, kind.dtype, count)
    return obj, storages


def _load_zip(path: str):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise TorchPickleError(f"{path}: a zip, but not a torch file (no data.pkl)")
        prefix = pkl[0][: -len("data.pkl")]
        unpickler = _Unpickler(io.BytesIO(z.read(pkl[0])), path)
        obj = unpickler.load()
        storages = {}
        for key, (kind, numel) in unpickler.storages.items():
            data = z.read(f"{prefix}data/{key}")
            if len(data) < numel * kind.dtype.itemsize:
                raise TorchPickleError(f"{path}: storage {key} is truncated")
            storages[key] = np.frombuffer(data, kind.dtype, numel)
    return obj, storages


def _read(fh, n: int, path: str) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise TorchPickleError(f"{path}: truncated ({len(data)} of {n} bytes at the end)")
    return data
