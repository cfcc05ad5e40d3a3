"""trellis_store (the Python client) against a real `trellis store` process: put, lookup,
get into a numpy array in place, increments, a miss for another namespace, errors."""
import os
import re
import subprocess

import numpy as np
import pytest

import trellis_store as ts

BLOCK = 8192
BT = 32


@pytest.fixture(scope="module")
def server():
    p = subprocess.Popen([os.environ["TRELLIS"], "store", "--listen", "127.0.0.1:0", "--mem", "16M",
                          "--net-devices", "lo"], stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "trellis store did not start"
    yield f"127.0.0.1:{port}"
    p.terminate()
    p.wait(timeout=10)


def blocks_for(tokens, seed):
    n = len(tokens) // BT
    return np.random.default_rng(seed).integers(0, 256, size=(n, BLOCK), dtype=np.uint8)


def test_put_lookup_get_in_place(server):
    c = ts.Client([server], net_devices="lo")
    ns = ts.Namespace(model_fingerprint=0xfeed, block_tokens=BT)
    tokens = list(range(1, 1 + 10 * BT + 5))
    src = blocks_for(tokens, 1)
    assert c.put(ns, tokens, src) == 10
    assert c.put(ns, tokens, src) == 0  # already stored
    found = c.lookup(ns, tokens)
    assert found.blocks == 10
    out = np.zeros((10, BLOCK), np.uint8)
    c.get(found, out)
    assert np.array_equal(out, src)
    half = np.zeros((4, BLOCK), np.uint8)
    c.get(found, half)
    assert np.array_equal(half, src[:4])
    assert c.stats()["get_blocks"] == 14


def test_increments_and_namespaces(server):
    c = ts.Client([server], net_devices="lo")
    ns = ts.Namespace(model_fingerprint=0xbeef, block_tokens=BT)
    a = list(range(1000, 1000 + 8 * BT))
    b = a[:5 * BT] + list(range(5000, 5000 + 3 * BT))
    assert c.put(ns, a, blocks_for(a, 2)) == 8
    assert c.put(ns, b, blocks_for(b, 3)) == 3  # shares 5 blocks with a
    assert c.lookup(ns, b).blocks == 8
    assert c.lookup(ns, b).tensors == 2
    other = ts.Namespace(model_fingerprint=0xbeef, block_tokens=BT, salt=7)
    assert c.lookup(other, b).blocks == 0


def test_bad_arguments_raise(server):
    c = ts.Client([server], net_devices="lo")
    ns = ts.Namespace(model_fingerprint=1, block_tokens=BT)
    tokens = list(range(2 * BT))
    c.put(ns, tokens, blocks_for(tokens, 4))
    found = c.lookup(ns, tokens)
    with pytest.raises(TypeError):
        c.get(found, np.zeros((2, BLOCK), np.float32))  # never a silent copy
    with pytest.raises(ValueError):
        c.get(found, np.zeros((3, BLOCK), np.uint8))  # more rows than found
    with pytest.raises(RuntimeError):
        ts.Client(["127.0.0.1:1"], net_devices="lo", timeout=2.0)  # nobody there
