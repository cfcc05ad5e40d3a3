#include "kv/prefix_store.h"

namespace trellis {

const char* StoreMissName(StoreMiss m) {
  switch (m) {
    case StoreMiss::kNone: return "none";
    case StoreMiss::kNotStored: return "not_stored";
    case StoreMiss::kEvicted: return "evicted";
    case StoreMiss::kFingerprint: return "fingerprint_mismatch";
    case StoreMiss::kChecksum: return "checksum_failure";
    case StoreMiss::kDeadline: return "deadline";
    case StoreMiss::kDown: return "store_down";
    case StoreMiss::kSlower: return "fetch_slower_than_compute";
    case StoreMiss::kPendingTimeout: return "pending_elsewhere_timeout";
    case StoreMiss::kError: return "store_error";
  }
  return "?";
}

}  // namespace trellis
