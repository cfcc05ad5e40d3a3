// trellis_store: the prefix tensor store's client for Python (pybind11), as the PTStore
// design offers one to runtimes such as vLLM.
//
//   import numpy as np, trellis_store as ts
//   c = ts.Client(["127.0.0.1:7600"], net_devices="lo")
//   ns = ts.Namespace(model_fingerprint=0xfeed, block_tokens=32)
//   c.put(ns, tokens, blocks)            # blocks: uint8 array (n_blocks, block_bytes)
//   found = c.lookup(ns, tokens)         # found.blocks: the longest stored prefix
//   out = np.empty((found.blocks, block_bytes), np.uint8)
//   c.get(found, out)                    # fills `out` in place: no copy
//
// Errors raise: RuntimeError with the store's status text (a miss of any kind is an
// error the caller may treat as "recompute"). Deadlines are in seconds. The GIL is
// released while a call waits on the network.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "store/client.h"

namespace py = pybind11;
using namespace trellis;

namespace {

net::Deadline In(double seconds) {
  return net::Clock::now() + std::chrono::duration_cast<net::Clock::duration>(std::chrono::duration<double>(seconds));
}

[[noreturn]] void Raise(const Status& s) { throw std::runtime_error(s.ToString()); }

// A C-contiguous uint8 array of shape (n, block_bytes): the block pointers into it.
template <typename Ptr, typename Array>
std::vector<Ptr> Rows(Array& a, uint64_t& block_bytes) {
  if (a.ndim() != 2) throw std::invalid_argument("blocks must be a 2-D uint8 array (n_blocks, block_bytes)");
  block_bytes = static_cast<uint64_t>(a.shape(1));
  if (block_bytes == 0) throw std::invalid_argument("block_bytes must be > 0");
  std::vector<Ptr> rows;
  for (py::ssize_t i = 0; i < a.shape(0); ++i) rows.push_back(const_cast<Ptr>(static_cast<const void*>(a.data(i, 0))));
  return rows;
}

}  // namespace

PYBIND11_MODULE(trellis_store, m) {
  m.doc() = "Client of Trellis's prefix tensor store (docs/store.md)";

  py::class_<store::Namespace>(m, "Namespace")
      .def(py::init([](uint64_t fp, uint32_t block_tokens, uint32_t kv_dtype, uint32_t layout_version, uint64_t salt) {
             store::Namespace ns;
             ns.model_fingerprint = fp;
             ns.block_tokens = block_tokens;
             ns.kv_dtype = kv_dtype;
             ns.layout_version = layout_version;
             ns.salt = salt;
             return ns;
           }),
           py::kw_only(), py::arg("model_fingerprint"), py::arg("block_tokens") = 32, py::arg("kv_dtype") = 0,
           py::arg("layout_version") = 1, py::arg("salt") = 0)
      .def_readonly("model_fingerprint", &store::Namespace::model_fingerprint)
      .def_readonly("block_tokens", &store::Namespace::block_tokens);

  py::class_<store::LookupResult>(m, "Found")
      .def_readonly("blocks", &store::LookupResult::blocks, "whole blocks of the longest stored prefix")
      .def_property_readonly("tensors", [](const store::LookupResult& r) { return r.runs.size(); },
                             "how many stored tensors those blocks come from");

  py::class_<store::StoreClient>(m, "Client")
      .def(py::init([](std::vector<std::string> servers, std::string net_devices, uint32_t lease_ms, double timeout) {
             store::ClientOptions o;
             o.servers = std::move(servers);
             o.transport.net_devices = std::move(net_devices);
             o.lease_ms = lease_ms;
             py::gil_scoped_release nogil;
             auto c = store::StoreClient::Connect(o, In(timeout));
             if (!c.ok()) Raise(c.status());
             return std::move(c).value();
           }),
           py::arg("servers"), py::kw_only(), py::arg("net_devices") = "", py::arg("lease_ms") = 5000,
           py::arg("timeout") = 10.0)
      .def(
          "lookup",
          [](store::StoreClient& c, const store::Namespace& ns, std::vector<int32_t> tokens, double timeout) {
            py::gil_scoped_release nogil;
            auto r = c.Lookup(ns, tokens, In(timeout));
            if (!r.ok()) Raise(r.status());
            return std::move(r).value();
          },
          py::arg("ns"), py::arg("tokens"), py::kw_only(), py::arg("timeout") = 5.0,
          "the longest stored prefix of `tokens`, in whole blocks")
      .def(
          "get",
          [](store::StoreClient& c, const store::LookupResult& found, py::array_t<uint8_t, py::array::c_style> out,
             double timeout) {
            uint64_t bb = 0;
            auto rows = Rows<void*>(out, bb);
            for (size_t i = 0; i < rows.size(); ++i) rows[i] = out.mutable_data(static_cast<py::ssize_t>(i), 0);
            if (rows.size() > found.blocks) throw std::invalid_argument("`out` has more rows than blocks were found");
            py::gil_scoped_release nogil;
            const Status s = c.Get(found, rows.size(), rows, bb, In(timeout));
            if (!s.ok()) Raise(s);
          },
          py::arg("found"), py::arg("out"), py::kw_only(), py::arg("timeout") = 10.0,
          "reads the first out.shape[0] blocks of `found` into `out` (uint8, C-contiguous, (n, block_bytes))")
      .def(
          "put",
          [](store::StoreClient& c, const store::Namespace& ns, std::vector<int32_t> tokens,
             py::array_t<uint8_t, py::array::c_style | py::array::forcecast> blocks, double cost_s, double timeout) {
            uint64_t bb = 0;
            auto rows = Rows<const void*>(blocks, bb);
            py::gil_scoped_release nogil;
            auto r = c.Put(ns, tokens, rows, bb, cost_s, In(timeout));
            if (!r.ok()) Raise(r.status());
            return *r;
          },
          py::arg("ns"), py::arg("tokens"), py::arg("blocks"), py::kw_only(), py::arg("cost_s") = 1.0,
          py::arg("timeout") = 10.0, "stores the blocks past the longest stored prefix; returns how many were new")
      .def("stats", [](const store::StoreClient& c) {
        const store::ClientStats s = c.stats();
        return py::dict(py::arg("lookups") = s.lookups, py::arg("gets") = s.gets, py::arg("get_blocks") = s.get_blocks,
                        py::arg("puts") = s.puts, py::arg("put_blocks") = s.put_blocks,
                        py::arg("checksum_failures") = s.checksum_failures, py::arg("misses_down") = s.misses_down,
                        py::arg("misses_deadline") = s.misses_deadline, py::arg("misses_evicted") = s.misses_evicted);
      });
}
