#include "model/ggml_type.h"

namespace trellis {

GgmlTypeTraits GetGgmlTypeTraits(uint32_t id) {
  switch (static_cast<GgmlType>(id)) {
    case GgmlType::kF32: return {"f32", 1, 4, true};
    case GgmlType::kF16: return {"f16", 1, 2, true};
    case GgmlType::kQ4_0: return {"q4_0", 32, 18, true};
    case GgmlType::kQ4_1: return {"q4_1", 32, 20, false};
    case GgmlType::kQ5_0: return {"q5_0", 32, 22, true};
    case GgmlType::kQ5_1: return {"q5_1", 32, 24, true};
    case GgmlType::kQ8_0: return {"q8_0", 32, 34, true};
    case GgmlType::kQ8_1: return {"q8_1", 32, 36, false};
    case GgmlType::kQ2_K: return {"q2_K", 256, 84, true};
    case GgmlType::kQ3_K: return {"q3_K", 256, 110, true};
    case GgmlType::kQ4_K: return {"q4_K", 256, 144, true};
    case GgmlType::kQ5_K: return {"q5_K", 256, 176, true};
    case GgmlType::kQ6_K: return {"q6_K", 256, 210, true};
    case GgmlType::kQ8_K: return {"q8_K", 256, 292, false};
    case GgmlType::kIQ2_XXS: return {"iq2_xxs", 256, 66, false};
    case GgmlType::kIQ2_XS: return {"iq2_xs", 256, 74, false};
    case GgmlType::kIQ3_XXS: return {"iq3_xxs", 256, 98, false};
    case GgmlType::kIQ1_S: return {"iq1_s", 256, 50, false};
    case GgmlType::kIQ4_NL: return {"iq4_nl", 32, 18, true};
    case GgmlType::kIQ3_S: return {"iq3_s", 256, 110, false};
    case GgmlType::kIQ2_S: return {"iq2_s", 256, 82, false};
    case GgmlType::kIQ4_XS: return {"iq4_xs", 256, 136, true};
    case GgmlType::kI8: return {"i8", 1, 1, false};
    case GgmlType::kI16: return {"i16", 1, 2, false};
    case GgmlType::kI32: return {"i32", 1, 4, false};
    case GgmlType::kI64: return {"i64", 1, 8, false};
    case GgmlType::kF64: return {"f64", 1, 8, false};
    case GgmlType::kIQ1_M: return {"iq1_m", 256, 56, false};
    case GgmlType::kBF16: return {"bf16", 1, 2, true};
    case GgmlType::kTQ1_0: return {"tq1_0", 256, 54, false};
    case GgmlType::kTQ2_0: return {"tq2_0", 256, 66, false};
    case GgmlType::kMXFP4: return {"mxfp4", 32, 17, false};
  }
  return {"", 0, 0, false};
}

}  // namespace trellis
