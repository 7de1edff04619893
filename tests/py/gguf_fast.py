"""gguf.GGUFReader with its array fields parsed in one pass.

The `gguf` package's reader builds every element of an array field through
its generic per-value path, a few numpy views each: opening Gemma 3 (a
262,144-token vocabulary as three arrays) took 28-36 s, SmolLM2 7 s, and the
suite opens real models with it several times. This subclass builds the same
parts for arrays of scalars and of strings (the same numpy views of the same
bytes, the same data indexes and types), so every reader API (fields,
contents(), tensors) answers as before; anything else (nested arrays, a file
of the other byte order) goes through the package's own code.
test_gguf_fast.py compares the two readers field by field."""
import struct

import numpy as np
from gguf import GGUFReader as _Reader
from gguf import GGUFValueType


class GGUFReader(_Reader):
    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs
        raw_itype = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        offs += 12
        itype, n = GGUFValueType(raw_itype[0]), int(alen[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if itype != GGUFValueType.STRING and nptype is None:
            return super()._get_field_parts(orig_offs, raw_type)
        parts = [raw_itype, alen]
        types = [GGUFValueType.ARRAY] + ([itype] if n else [])
        if nptype is not None:
            vals = self._get(offs, nptype, n).view(np.ndarray)
            parts += [vals[i:i + 1] for i in range(n)]
            offs += int(vals.nbytes)
            return offs - orig_offs, parts, list(range(2, 2 + n)), types
        data = self.data.view(np.ndarray)
        buf = memoryview(data)
        u64 = np.dtype(np.uint64).newbyteorder("I")
        idxs = []
        for i in range(n):
            (slen,) = struct.unpack_from("=Q", buf, offs)
            parts.append(data[offs:offs + 8].view(u64))
            parts.append(data[offs + 8:offs + 8 + slen])
            idxs.append(3 + 2 * i)
            offs += 8 + slen
        return offs - orig_offs, parts, idxs, types
