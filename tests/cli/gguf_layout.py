#!/usr/bin/env python3
"""Prints the byte layout of a GGUF file (v2/v3, little-endian) for the CLI tests:

    header_end meta_end tinfo_end data_offset file_size

header_end: end of magic+version+counts; meta_end: end of the key/value section (start of
the tensor infos); tinfo_end: end of the tensor infos; data_offset: start of tensor data
(tinfo_end rounded up to general.alignment). Only reads well-formed files.
"""
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main(path):
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF", "not GGUF"
    version, = struct.unpack_from("<I", b, 4)
    n_tensors, n_kv = struct.unpack_from("<QQ", b, 8)
    off = 24
    header_end = off
    alignment = 32

    def string(o):
        n, = struct.unpack_from("<Q", b, o)
        return b[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n

    def value(t, o):
        if t in SCALAR:
            return o + SCALAR[t]
        if t == 8:
            return string(o)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            for _ in range(n):
                o = value(et, o)
            return o
        raise ValueError(f"value type {t}")

    for _ in range(n_kv):
        key, off = string(off)
        t, = struct.unpack_from("<I", b, off)
        off += 4
        if key == "general.alignment" and t == 4:
            alignment, = struct.unpack_from("<I", b, off)
        off = value(t, off)
    meta_end = off
    for _ in range(n_tensors):
        _, off = string(off)
        nd, = struct.unpack_from("<I", b, off)
        off += 4 + 8 * nd + 4 + 8
    tinfo_end = off
    data_offset = (off + alignment - 1) // alignment * alignment
    print(header_end, meta_end, tinfo_end, data_offset, len(b))


if __name__ == "__main__":
    main(sys.argv[1])
