// The validation tests' check: `edit` makes a valid argument set invalid, and
// validate() answers kInvalidArgument with a message that starts with `names`.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "flash3/flash3.h"

namespace flash3::testing {

template <class Args>
Status expect_invalid_args(Args a, std::function<void(Args&)> const& edit, std::string const& names) {
  edit(a);
  Status s = flash3::validate(a);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << names;
  EXPECT_EQ(s.message().rfind(names, 0), 0u) << "message '" << s.message() << "' should start with '" << names << "'";
  return s;
}

}  // namespace flash3::testing
