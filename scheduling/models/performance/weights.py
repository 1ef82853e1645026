"""Read the weights a `torch.save` file holds as numpy arrays, without importing torch.

A `torch.save` file is a zip archive: `<name>/data.pkl` pickles the saved object (here a state dict or a list of
state dicts), every tensor in it a call `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` whose
storage is a persistent id `("storage", <dtype>Storage, key, location, numel)` naming the raw little-endian bytes
in `<name>/data/<key>`. `read_state` unpickles data.pkl with an unpickler that knows only those calls (and
`collections.OrderedDict`), so a file that pickles anything else is refused instead of run.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class WeightsError(ValueError):
    """A weights file that is not a readable `torch.save` archive of plain tensors."""


class _StorageType:
    """Stands for a `torch.<dtype>Storage` class named in data.pkl."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(STORAGE_DTYPES[name])


class _Unpickler(pickle.Unpickler):
    """data.pkl's unpickler: storages from the archive, tensors as numpy arrays, nothing else."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: Path):
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix, self.path = archive, prefix, path

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild_tensor
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise WeightsError(f"{self.path}: refuses to unpickle {module}.{name} (only tensors and state dicts)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise WeightsError(f"{self.path}: unexpected persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType):
            raise WeightsError(f"{self.path}: storage of unsupported type {kind!r}")
        try:
            raw = self.archive.read(f"{self.prefix}/data/{key}")
        except KeyError:
            raise WeightsError(f"{self.path}: storage {key} is missing from the archive") from None
        if len(raw) != int(numel) * kind.dtype.itemsize:
            raise WeightsError(
                f"{self.path}: storage {key} holds {len(raw)} bytes, not {numel} x {kind.dtype} ({kind.name})"
            )
        return np.frombuffer(raw, dtype=kind.dtype.newbyteorder("<"))

    def _rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        """The array a tensor view (offset, size, stride, all in elements) of `storage` selects, copied."""
        if not isinstance(storage, np.ndarray):
            raise WeightsError(f"{self.path}: a tensor without a storage")
        if hooks or metadata:
            raise WeightsError(f"{self.path}: a tensor with backward hooks or metadata")
        size, stride, offset = tuple(int(s) for s in size), tuple(int(s) for s in stride), int(offset)
        if len(size) != len(stride) or offset < 0 or any(s < 0 for s in size) or any(s < 0 for s in stride):
            raise WeightsError(f"{self.path}: tensor of size {size}, stride {stride}, offset {offset} is malformed")
        if 0 not in size:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride))
            if last >= len(storage):
                raise WeightsError(
                    f"{self.path}: tensor of size {size}, stride {stride}, offset {offset} "
                    f"reaches past its storage of {len(storage)} elements"
                )
        item = storage.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage[offset:], shape=size, strides=tuple(s * item for s in stride), writeable=False
        )
        return np.array(view, dtype=storage.dtype.newbyteorder("="))


def read_state(path: Path | str):
    """The object a `torch.save` file holds, its tensors as numpy arrays (dtype, shape, stride, offset as saved);
    WeightsError naming the file when it is not a zip archive of plain tensors and (ordered) dicts / lists."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WeightsError(f"{path}: not a torch.save archive ({exc})") from exc
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise WeightsError(f"{path}: expected one <name>/data.pkl in the archive, found {len(pickles)}")
        prefix = pickles[0].split("/")[0]
        names = set(archive.namelist())
        if f"{prefix}/byteorder" in names and archive.read(f"{prefix}/byteorder").strip() != b"little":
            raise WeightsError(f"{path}: storages are not little-endian")
        try:
            return _Unpickler(archive.read(pickles[0]), archive, prefix, path).load()
        except WeightsError:
            raise
        except Exception as exc:  # noqa: BLE001 - any other failure is a corrupt file, named as such
            raise WeightsError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from exc
