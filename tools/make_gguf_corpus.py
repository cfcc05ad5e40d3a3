#!/usr/bin/env python3
"""Generates tests/data/gguf_corpus/: small valid and malformed GGUF files.

Every file is built here from scratch (standard library only), so the corpus can be
regenerated and reviewed. The name carries the expectation checked by
tests/gguf_corpus_test.cc: `ok-*.gguf` must parse, `bad-*.gguf` must be rejected with a
message. Files the fuzzer found (tests/fuzz/gguf_fuzz.cc) are kept as
`bad-fuzz-*.gguf` / `ok-fuzz-*.gguf` and are not touched by this script.

Usage: tools/make_gguf_corpus.py [out_dir]   (default: tests/data/gguf_corpus)
The byte layout is described in docs/gguf.md.
"""
import os
import struct
import sys

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# GGML tensor types used here: (id, elements per block, bytes per block).
F32_T = (0, 1, 4)
F16_T = (1, 1, 2)
Q4_0_T = (2, 32, 18)
Q8_0_T = (8, 32, 34)
Q4_K_T = (12, 256, 144)
Q6_K_T = (14, 256, 210)

SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
              F32: "<f", BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def u32(x): return struct.pack("<I", x)
def u64(x): return struct.pack("<Q", x)
def gstr(s): b = s.encode() if isinstance(s, str) else s; return u64(len(b)) + b


def val(t, v):
    """Encodes a value of type t (no type tag). Arrays: v = (elem_type, [items])."""
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return u32(et) + u64(len(items)) + b"".join(val(et, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def kv(key, t, v):
    return gstr(key) + u32(t) + val(t, v)


class Tensor:
    def __init__(self, name, dims, ttype, offset=None, fill=0x11):
        self.name, self.dims, self.ttype, self.offset, self.fill = name, dims, ttype, offset, fill

    def nbytes(self):
        n = 1
        for d in self.dims:
            n *= d
        return n // self.ttype[1] * self.ttype[2]

    def info(self):
        return (gstr(self.name) + u32(len(self.dims)) + b"".join(u64(d) for d in self.dims) +
                u32(self.ttype[0]) + u64(self.offset))


def align_up(x, a):
    return (x + a - 1) // a * a


def build(kvs, tensors, version=3, alignment=32, magic=b"GGUF", n_kv=None, n_tensors=None,
          marks=None):
    """Assembles a file. Tensors without an explicit offset are packed in order.

    `marks`, if given, collects byte positions of interesting fields for truncation.
    """
    out = bytearray(magic + u32(version))
    out += u64(len(tensors) if n_tensors is None else n_tensors)
    out += u64(len(kvs) if n_kv is None else n_kv)
    m = marks if marks is not None else {}
    m["header_end"] = len(out)
    for i, b in enumerate(kvs):
        m.setdefault("kv%d" % i, len(out))
        out += b
    off = 0
    for t in tensors:
        if t.offset is None:
            t.offset = off
            off = align_up(off + t.nbytes(), alignment)
    m["tensor_infos"] = len(out)
    for i, t in enumerate(tensors):
        m["tinfo%d" % i] = len(out)
        out += t.info()
    m["infos_end"] = len(out)
    data_start = align_up(len(out), alignment)
    out += bytes(data_start - len(out))
    m["data"] = data_start
    # Data is written only for tensors small enough to matter; the absurd ones in the bad
    # files are meant to point past the end.
    small = [t for t in tensors if t.offset + t.nbytes() <= 4096]
    data = bytearray(max([t.offset + t.nbytes() for t in small], default=0))
    for t in small:
        data[t.offset:t.offset + t.nbytes()] = bytes([t.fill]) * t.nbytes()
    out += data
    out += bytes(align_up(len(out), alignment) - len(out))
    return bytes(out)


def base_kvs():
    return [
        kv("general.architecture", STR, "llama"),
        kv("llama.block_count", U32, 1),
        kv("llama.rope.freq_base", F32, 10000.0),
        kv("general.flag", BOOL, 1),
        kv("tokenizer.ggml.tokens", ARR, (STR, ["<unk>", "<s>", "</s>", "a"])),
        kv("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3, 1])),
    ]


def base_tensors():
    return [Tensor("token_embd.weight", [8, 2], F32_T, fill=0x3f),
            Tensor("output_norm.weight", [32], Q8_0_T, fill=0x22)]


def replace_field(buf, pos, old, new):
    """Replaces the bytes `old` found at `pos` with `new` (same length)."""
    assert buf[pos:pos + len(old)] == old, (pos, old)
    return buf[:pos] + new + buf[pos + len(new):]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "gguf_corpus")
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):  # regenerate ours, keep fuzzer finds
        if f.endswith(".gguf") and "-fuzz-" not in f:
            os.remove(os.path.join(out_dir, f))
    files = {}

    def emit(name, data):
        assert name.startswith(("ok-", "bad-")) and name not in files, name
        assert len(data) < 4096, (name, len(data))
        files[name] = data

    # ---- valid files -----------------------------------------------------------------
    marks = {}
    base = build(base_kvs(), base_tensors(), marks=marks)
    emit("ok-basic-v3.gguf", base)
    emit("ok-v2.gguf", build(base_kvs(), base_tensors(), version=2))
    emit("ok-no-tensors.gguf", build(base_kvs(), []))
    emit("ok-no-metadata.gguf", build([], base_tensors()))
    emit("ok-empty-header-only.gguf", build([], []))
    emit("ok-no-tensors-no-padding.gguf", build([kv("a", U8, 1)], [])[:24 + 14])
    emit("ok-alignment-64.gguf", build(base_kvs() + [kv("general.alignment", U32, 64)],
                                       base_tensors(), alignment=64))
    emit("ok-alignment-1.gguf", build([kv("general.alignment", U32, 1)],
                                      [Tensor("a", [3], F16_T), Tensor("b", [5], F16_T)], alignment=1))
    emit("ok-nested-array-2deep.gguf", build(
        [kv("x.nested", ARR, (ARR, [(I32, [1, 2]), (STR, ["p", "q", "r"]), (F32, [])]))], base_tensors()))
    emit("ok-nested-array-4deep.gguf", build(
        [kv("x.deep", ARR, (ARR, [(ARR, [(ARR, [(U8, [7])])])]))], []))
    all_types = [kv("t.u8", U8, 255), kv("t.i8", I8, -128), kv("t.u16", U16, 65535),
                 kv("t.i16", I16, -32768), kv("t.u32", U32, 2**32 - 1), kv("t.i32", I32, -2**31),
                 kv("t.f32", F32, -0.5), kv("t.bool0", BOOL, 0), kv("t.bool1", BOOL, 1),
                 kv("t.str", STR, "h\u00e9llo"), kv("t.empty_str", STR, ""), kv("", U8, 0),
                 kv("t.u64", U64, 2**64 - 1), kv("t.i64", I64, -2**63), kv("t.f64", F64, 1e300),
                 kv("t.nan", F32, float("nan")), kv("t.empty_arr", ARR, (U8, []))]
    for t in (U8, I8, U16, I16, U32, I32, F32, BOOL, U64, I64, F64):
        all_types.append(kv("t.arr%d" % t, ARR, (t, [0, 1])))
    all_types.append(kv("t.arr_str", ARR, (STR, ["", "x"])))
    emit("ok-all-value-types.gguf", build(all_types, []))
    emit("ok-quant-types-4dims.gguf", build(base_kvs(), [
        Tensor("q4_0", [32, 1, 1, 2], Q4_0_T), Tensor("q4_k", [256], Q4_K_T),
        Tensor("q6_k", [256, 1, 2], Q6_K_T), Tensor("f16", [1], F16_T)]))
    # Gaps between tensors and offsets out of file order are accepted (see docs/gguf.md).
    emit("ok-tensor-gap.gguf", build([], [Tensor("a", [8], F32_T, offset=0),
                                          Tensor("b", [8], F32_T, offset=256)]))
    emit("ok-tensors-out-of-order.gguf", build([], [Tensor("a", [8], F32_T, offset=32),
                                                    Tensor("b", [8], F32_T, offset=0)]))
    emit("ok-tensors-adjacent-alignment-1.gguf", build(
        [kv("general.alignment", U32, 1)],
        [Tensor("a", [3], F32_T, offset=0), Tensor("b", [1], F32_T, offset=12)], alignment=1))
    # No tensors, so the file may end before the (8 KiB) padding would.
    emit("ok-alignment-8192-no-padding.gguf",
         build([kv("general.alignment", U32, 8192)], [])[:24 + 8 + 17 + 4 + 4])
    emit("ok-alignment-as-u64.gguf", build([kv("general.alignment", U64, 16)],
                                           [Tensor("a", [4], F32_T)], alignment=16))

    # ---- header ----------------------------------------------------------------------
    emit("bad-empty-file.gguf", b"")
    emit("bad-magic.gguf", b"GGML" + base[4:])
    emit("bad-magic-lowercase.gguf", b"gguf" + base[4:])
    for v in (0, 1, 4, 0xFFFFFFFF):
        emit("bad-version-%d.gguf" % v, base[:4] + u32(v) + base[8:])
    emit("bad-version-3-big-endian.gguf", base[:4] + struct.pack(">I", 3) + base[8:])
    emit("bad-kv-count-huge.gguf", base[:16] + u64(2**63) + base[24:])
    emit("bad-kv-count-one-too-many.gguf", base[:16] + u64(7) + base[24:])
    emit("bad-tensor-count-huge.gguf", base[:8] + u64(2**64 - 1) + base[16:])
    emit("bad-tensor-count-one-too-many.gguf", base[:8] + u64(3) + base[16:])

    # ---- truncations at many points of the base file ---------------------------------
    kv0 = marks["kv0"]
    cuts = {
        "in-magic": 2, "after-magic": 4, "in-version": 6, "in-tensor-count": 12,
        "in-kv-count": 20, "in-key-length": kv0 + 3, "in-key": kv0 + 8 + 5,
        "in-value-type": kv0 + 8 + 20 + 2, "in-string-value-length": kv0 + 8 + 20 + 4 + 3,
        "in-string-value": kv0 + 8 + 20 + 4 + 8 + 2,
        "in-u32-value": marks["kv1"] + 8 + 17 + 4 + 2,
        "in-array-elem-type": marks["kv4"] + 8 + 21 + 4 + 1,
        "in-array-count": marks["kv4"] + 8 + 21 + 4 + 4 + 3,
        "in-array-strings": marks["kv4"] + 8 + 21 + 4 + 4 + 8 + 40,
        "in-array-ints": marks["kv5"] + 8 + 25 + 4 + 4 + 8 + 6,
        "at-tensor-infos": marks["tensor_infos"],
        "in-tensor-name": marks["tinfo0"] + 10, "in-tensor-ndims": marks["tinfo0"] + 8 + 17 + 2,
        "in-tensor-dims": marks["tinfo0"] + 8 + 17 + 4 + 9,
        "in-tensor-type": marks["tinfo0"] + 8 + 17 + 4 + 16 + 1,
        "in-tensor-offset": marks["tinfo0"] + 8 + 17 + 4 + 16 + 4 + 4,
        "in-second-tensor-info": marks["tinfo1"] + 20,
        "after-tensor-infos": marks["infos_end"], "in-padding": marks["data"] - 1,
        "at-data": marks["data"], "in-first-tensor-data": marks["data"] + 30,
        "in-last-tensor-data": marks["data"] + 64 + 20,
        "last-byte-of-data": marks["data"] + 64 + 33,
    }
    for what, n in cuts.items():
        assert 0 <= n < len(base)
        cut = base[:n]
        # A cut inside metadata entry i: claim only i + 1 entries and no tensors, so the
        # reader gets past the header's count check and fails inside that entry.
        kv_at = [i for i in range(len(base_kvs())) if marks["kv%d" % i] <= n]
        if n > marks["header_end"] and n < marks["tensor_infos"] and kv_at:
            cut = cut[:8] + u64(0) + u64(kv_at[-1] + 1) + cut[24:]
        emit("bad-truncated-%s.gguf" % what, cut)

    # ---- strings and arrays ----------------------------------------------------------
    emit("bad-key-length-huge.gguf", base[:kv0] + u64(2**63 + 5) + base[kv0 + 8:])
    emit("bad-key-length-past-eof.gguf", base[:kv0] + u64(len(base)) + base[kv0 + 8:])
    emit("bad-string-value-length-huge.gguf", build(
        [kv("a", U8, 1), gstr("s") + u32(STR) + u64(2**64 - 1) + b"abc"], []))
    emit("bad-string-value-length-past-eof.gguf", build(
        [gstr("s") + u32(STR) + u64(40) + b"only-a-few"], [])[:24 + 9 + 4 + 8 + 10])
    emit("bad-array-count-huge.gguf", build(
        [gstr("a") + u32(ARR) + u32(U32) + u64(2**62) + u32(1)], []))
    emit("bad-array-count-past-eof.gguf", build(
        [gstr("a") + u32(ARR) + u32(U64) + u64(3) + u64(1) + u64(2)], [])[:24 + 9 + 4 + 4 + 8 + 16])
    emit("bad-string-array-count-huge.gguf", build(
        [gstr("a") + u32(ARR) + u32(STR) + u64(2**61) + gstr("x")], []))
    emit("bad-string-array-element-length-huge.gguf", build(
        [gstr("a") + u32(ARR) + u32(STR) + u64(2) + gstr("x") + u64(2**40) + b"yy"], []))
    emit("bad-nested-array-too-deep.gguf", build(
        [kv("x.deep", ARR, (ARR, [(ARR, [(ARR, [(ARR, [(U8, [7])])])])]))], []))
    emit("bad-nested-array-inner-count-huge.gguf", build(
        [gstr("a") + u32(ARR) + u32(ARR) + u64(1) + u32(U8) + u64(2**50) + b"\0"], []))
    emit("bad-nested-array-inner-type-unknown.gguf", build(
        [gstr("a") + u32(ARR) + u32(ARR) + u64(1) + u32(99) + u64(1) + b"\0"], []))
    emit("bad-value-type-13.gguf", build([kv("a", U8, 1), gstr("b") + u32(13) + u32(0)], []))
    emit("bad-value-type-huge.gguf", build([gstr("b") + u32(0xFFFFFFFF) + u32(0)], []))
    emit("bad-array-elem-type-unknown.gguf", build(
        [gstr("a") + u32(ARR) + u32(77) + u64(1) + u32(0)], []))
    emit("bad-bool-value-2.gguf", build([gstr("general.flag") + u32(BOOL) + b"\x02"], []))
    emit("bad-bool-array-value-255.gguf", build(
        [gstr("flags") + u32(ARR) + u32(BOOL) + u64(3) + b"\x00\x01\xff"], []))
    emit("bad-duplicate-key.gguf", build(base_kvs() + [kv("llama.block_count", U32, 2)],
                                         base_tensors()))
    emit("bad-duplicate-key-different-type.gguf", build(
        [kv("k", STR, "x"), kv("k", ARR, (U8, [1]))], []))

    # ---- alignment -------------------------------------------------------------------
    emit("bad-alignment-0.gguf", build([kv("general.alignment", U32, 0)], []))
    emit("bad-alignment-3.gguf", build([kv("general.alignment", U32, 3)], []))
    emit("bad-alignment-48.gguf", build([kv("general.alignment", U32, 48)], []))
    emit("bad-alignment-2-pow-31.gguf", build([kv("general.alignment", U32, 2**31)], []))
    emit("bad-alignment-negative.gguf", build([kv("general.alignment", I32, -32)], []))
    emit("bad-alignment-string.gguf", build([kv("general.alignment", STR, "32")], []))
    emit("bad-alignment-float.gguf", build([kv("general.alignment", F32, 32.0)], []))
    # Tensors laid out for 32 but the file says 64: the second offset (64) is fine, so use 3
    # tensors whose packed offsets include 32.
    emit("bad-offset-misaligned-for-declared-alignment.gguf", build(
        [kv("general.alignment", U32, 64)],
        [Tensor("a", [8], F32_T, offset=0), Tensor("b", [8], F32_T, offset=32)], alignment=64))

    # ---- tensor infos ----------------------------------------------------------------
    def one(dims, ttype=F32_T, offset=0, name="t", extra_kvs=()):
        t = Tensor(name, dims, ttype, offset)
        return build(list(extra_kvs), [t])

    emit("bad-tensor-0-dims.gguf", one([]))
    emit("bad-tensor-5-dims.gguf", one([1, 1, 1, 1, 1]))
    emit("bad-tensor-ndims-huge.gguf", replace_field(one([4]), 24 + 8 + 1, u32(1), u32(2**31)))
    emit("bad-tensor-zero-dimension.gguf", one([4, 0]))
    emit("bad-tensor-dimension-negative.gguf", one([4, 2**64 - 4]))
    emit("bad-tensor-dimension-2-pow-41.gguf", one([2**41]))
    emit("bad-tensor-element-count-overflow.gguf", one([2**32, 2**32]))
    emit("bad-tensor-element-count-overflow-4dims.gguf", one([2**20, 2**20, 2**20, 2**20]))
    emit("bad-tensor-element-count-2-pow-43.gguf", one([2**22, 2**21]))
    emit("bad-tensor-type-4-removed.gguf", one([32], (4, 32, 20)))
    emit("bad-tensor-type-31-removed.gguf", one([32], (31, 32, 18)))
    emit("bad-tensor-type-huge.gguf", one([32], (0xFFFFFFFF, 1, 4)))
    emit("bad-tensor-row-not-block-multiple-q8_0.gguf", one([16, 2], (8, 1, 34)))
    emit("bad-tensor-row-not-block-multiple-q4_k.gguf", one([32], (12, 1, 144)))
    emit("bad-tensor-offset-misaligned.gguf", build([], [Tensor("a", [8], F32_T, offset=0),
                                                         Tensor("b", [8], F32_T, offset=36)]))
    emit("bad-tensor-offset-past-eof.gguf", replace_field(
        build([], [Tensor("a", [8], F32_T, offset=0)]), 24 + 8 + 1 + 4 + 8 + 4, u64(0), u64(4096)))
    emit("bad-tensor-offset-overflow.gguf", replace_field(
        build([], [Tensor("a", [8], F32_T, offset=0)]), 24 + 8 + 1 + 4 + 8 + 4, u64(0), u64(2**64 - 32)))
    emit("bad-tensor-data-past-eof.gguf", one([4096]))
    emit("bad-tensor-data-one-byte-short.gguf", one([8])[:-1])
    emit("bad-tensors-overlap-same-offset.gguf", build(
        [], [Tensor("a", [8], F32_T, offset=0), Tensor("b", [8], F32_T, offset=0)]))
    emit("bad-tensors-overlap-partial.gguf", build(
        [], [Tensor("a", [16], F32_T, offset=0), Tensor("b", [8], F32_T, offset=32)]))
    emit("bad-tensors-overlap-out-of-order.gguf", build(
        [], [Tensor("a", [8], F32_T, offset=64), Tensor("b", [8], F32_T, offset=0),
             Tensor("c", [24], F32_T, offset=32)]))
    emit("bad-duplicate-tensor-name.gguf", build(
        base_kvs(), [Tensor("w", [8], F32_T), Tensor("w", [8], F32_T)]))
    emit("bad-tensor-name-length-huge.gguf", replace_field(one([4]), 24, u64(1), u64(2**63)))

    for name, data in sorted(files.items()):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    n_ok = sum(1 for n in files if n.startswith("ok-"))
    print("wrote %d files (%d ok, %d bad) to %s" % (len(files), n_ok, len(files) - n_ok, out_dir))


if __name__ == "__main__":
    main()
