#include "planner/plot_script.h"

#include "planner/plot_script_text.h"

namespace pdserve::planner {
const char* GoodputPlotScript() { return kGoodputPlotScript; }
}  // namespace pdserve::planner
