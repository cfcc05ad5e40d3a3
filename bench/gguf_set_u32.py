#!/usr/bin/env python3
"""Sets one uint32 metadata value of a GGUF file in place (the file's size and layout do
not change). For benchmarks that need a longer trained context than a generated model
declares: llama-server caps each slot's context at `llama.context_length`.

  bench/gguf_set_u32.py /tmp/bm/tinyllama-q4_0.gguf llama.context_length 8192
"""
import struct, sys

TYPE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def main():
    path, key, value = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
    with open(path, "r+b") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            sys.exit(f"{path}: not a GGUF v2+ file")

        def skip(t):
            if t == 8:
                (n,) = struct.unpack("<Q", f.read(8))
                f.seek(n, 1)
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    skip(et)
            else:
                f.seek(TYPE_SIZES[t], 1)

        for _ in range(n_kv):
            (klen,) = struct.unpack("<Q", f.read(8))
            k = f.read(klen)
            (t,) = struct.unpack("<I", f.read(4))
            if k == key:
                if t != 4:
                    sys.exit(f"{key.decode()} has type {t}, not uint32")
                pos = f.tell()
                (old,) = struct.unpack("<I", f.read(4))
                f.seek(pos)
                f.write(struct.pack("<I", value))
                print(f"{path}: {key.decode()} {old} -> {value}")
                return
            skip(t)
    sys.exit(f"{path}: no key {key.decode()}")


if __name__ == "__main__":
    main()
