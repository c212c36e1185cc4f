#include "core/status.h"

#include <gtest/gtest.h>

namespace m3 {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("x must be positive, got " + std::to_string(x));
  return x;
}

Result<int> doubled(int x) {
  M3_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

TEST(Status, ResultCarriesValueOrError) {
  EXPECT_EQ(*doubled(4), 8);
  Result<int> bad = doubled(-1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().to_string(), "invalid argument: x must be positive, got -1");
}

TEST(Status, CheckThrowsInternalError) {
  EXPECT_THROW(M3_CHECK(1 == 2, "math"), InternalError);
  EXPECT_NO_THROW(M3_CHECK(1 == 1));
}

}  // namespace
}  // namespace m3
