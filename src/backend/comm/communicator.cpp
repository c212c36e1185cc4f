#include "backend/comm/communicator.h"

namespace m3::comm {

size_t element_bytes(DataType t) {
  switch (t) {
    case DataType::kF32: return 4;
    case DataType::kBF16: return 2;
    case DataType::kI32: return 4;
    case DataType::kI64: return 8;
    case DataType::kU8: return 1;
  }
  return 1;
}

const char* data_type_name(DataType t) {
  switch (t) {
    case DataType::kF32: return "f32";
    case DataType::kBF16: return "bf16";
    case DataType::kI32: return "i32";
    case DataType::kI64: return "i64";
    case DataType::kU8: return "u8";
  }
  return "?";
}

}  // namespace m3::comm
