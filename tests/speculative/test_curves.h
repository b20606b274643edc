#pragma once
// Synthetic cost curves for the cap and scheduler tests.
#include <vector>

#include "speculative/cap.h"

namespace dspark::testing {

inline CostCurves curves_of(std::vector<double> verify, std::vector<double> drafter = {},
                            double overhead = 0.0) {
  CostCurves curves;
  curves.verify_ms = std::move(verify);
  curves.drafter_ms = std::move(drafter);
  curves.overhead_ms = overhead;
  return curves;
}

}  // namespace dspark::testing
