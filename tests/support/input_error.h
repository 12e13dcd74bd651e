// The headline of the InputError a call throws, for tests of error messages.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "shardmm/core/error.h"

namespace shardmm::testing {

// The headline of the InputError `f` throws ("" and a test failure when it throws none).
inline std::string input_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.headline();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

}  // namespace shardmm::testing
