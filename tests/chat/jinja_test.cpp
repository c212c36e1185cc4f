#include <gtest/gtest.h>

#include "chat/jinja/template.h"

namespace m3::jinja {
namespace {

TEST(Jinja, Placeholder) { EXPECT_TRUE(Template::parse("x").is_ok()); }

}  // namespace
}  // namespace m3::jinja
