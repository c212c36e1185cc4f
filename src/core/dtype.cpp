#include "core/dtype.h"

namespace m3 {

namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},         {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kU8, "U8", 1},     {DType::kI8, "I8", 1},           {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},   {DType::kI64, "I64", 8},         {DType::kU16, "U16", 2},
    {DType::kU32, "U32", 4},   {DType::kU64, "U64", 8},         {DType::kBool, "BOOL", 1},
};

const DTypeInfo& info(DType t) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.type == t) return i;
  }
  M3_CHECK(false, "unknown DType value " + std::to_string(int(t)));
  __builtin_unreachable();
}

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }

const char* dtype_name(DType t) { return info(t).name; }

Result<DType> parse_dtype(std::string_view s) {
  for (const DTypeInfo& i : kDTypes) {
    if (s == i.name) return i.type;
  }
  return invalid_argument("unknown dtype '" + std::string(s) + "'");
}

}  // namespace m3
