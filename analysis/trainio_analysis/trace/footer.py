"""A check of a Parquet footer's consistency that pyarrow does not make safely.

pyarrow (Arrow C++) aborts the whole process ("terminate called after throwing an
instance of 'parquet::ParquetException'") when Python asks for the metadata of a column
chunk whose physical type differs from its schema column's: the exception is thrown
where Cython cannot catch it. A corrupt segment must be one line and exit 2, so the
reader walks the footer's Thrift (compact protocol) first and checks what that accessor
checks: every row group has one chunk per leaf column, each of the leaf's type.

Example
-------
>>> check_footer(b"PAR1")
'no Parquet footer'
"""

from __future__ import annotations

from typing import Any

_MAGIC = b"PAR1"

# compact protocol type ids
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12
_MAX_DEPTH = 32


class _Corrupt(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise _Corrupt("footer ends early")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise _Corrupt("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Corrupt("length beyond the footer")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, kind: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise _Corrupt("nesting too deep")
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return kind == _BOOL_TRUE
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            return self.skip(8)
        if kind == _BINARY:
            return self.skip(self.varint())
        if kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data):
                raise _Corrupt("list longer than the footer")
            if elem in (_BOOL_TRUE, _BOOL_FALSE):  # list<bool>: one byte per element
                return [self.byte() == _BOOL_TRUE for _ in range(size)]
            return [self.value(elem, depth + 1) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            if size == 0:
                return {}
            kinds = self.byte()
            if size > len(self.data):
                raise _Corrupt("map longer than the footer")
            return [(self.value(kinds >> 4, depth + 1), self.value(kinds & 0x0F, depth + 1)) for _ in range(size)]
        if kind == _STRUCT:
            return self.struct(depth + 1)
        raise _Corrupt(f"unknown Thrift type {kind}")

    def struct(self, depth: int = 0) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            fields[fid] = self.value(kind, depth)
            last = fid


def check_footer(data: bytes) -> str | None:
    """What is wrong with a Parquet file's footer (given the file's last bytes, at least
    the footer and its 8-byte trailer), or None when its column chunks match its schema."""
    if len(data) < 12 or data[-4:] != _MAGIC:
        return "no Parquet footer"
    length = int.from_bytes(data[-8:-4], "little")
    if length <= 0 or length > len(data) - 8:
        return "footer length beyond the file"
    try:
        meta = _Reader(data[-8 - length : -8]).struct()
        schema = meta.get(2)
        row_groups = meta.get(4, [])
        if not isinstance(schema, list) or not isinstance(row_groups, list):
            return "footer without a schema or row groups"
        # leaves: schema elements with a physical type (field 1) and no children (field 5)
        leaves = [e.get(1) for e in schema[1:] if isinstance(e, dict) and not e.get(5)]
        for g, rg in enumerate(row_groups):
            chunks = rg.get(1) if isinstance(rg, dict) else None
            if not isinstance(chunks, list) or len(chunks) != len(leaves):
                return f"row group {g} has {len(chunks or [])} column chunks for {len(leaves)} columns"
            for c, (chunk, want) in enumerate(zip(chunks, leaves, strict=True)):
                meta_data = chunk.get(3) if isinstance(chunk, dict) else None
                if not isinstance(meta_data, dict) or meta_data.get(1) != want:
                    return f"row group {g}, column chunk {c}: physical type does not match the schema"
    except _Corrupt as exc:
        return f"corrupt footer ({exc})"
    return None


def check_file(path: Any) -> str | None:
    """:func:`check_footer` of a file on disk (reads only its footer)."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        if size < 12:
            return "no Parquet footer"
        f.seek(size - 8)
        trailer = f.read(8)
        length = int.from_bytes(trailer[:4], "little")
        if trailer[4:] != _MAGIC:
            return "no Parquet footer"
        if length > size - 8:
            return "footer length beyond the file"
        f.seek(size - 8 - length)
        return check_footer(f.read(length + 8))
