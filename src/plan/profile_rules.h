// The value rules every hardware profile obeys, for the formulas that take one from code
// (cost.cpp) as for profiles read from files (profiles.cpp).
#pragma once

#include <optional>
#include <string>

#include "shardmm/plan/cost.h"

namespace shardmm::detail {

// The first value rule `p` breaks, naming the key ("key 'x' must ..., got ..."): a rate below 1
// per second, a latency outside 0..1 s, an unknown topology; nullopt where it keeps them all.
std::optional<std::string> profile_problem(const HardwareProfile& p);

// InputError naming `where` ("p.json") and profile_problem's words, where there are any.
void validate_profile(const HardwareProfile& p, const std::string& where);

// validate_profile naming the profile ("hardware profile 'x'"): the cost formulas' check on
// every call, whose words are built only for a profile that breaks a rule.
void check_profile(const HardwareProfile& p);

}  // namespace shardmm::detail
