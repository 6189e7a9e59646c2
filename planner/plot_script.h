// The goodput-vs-split plot script (tools/planner/plot_goodput.py), compiled in so that
// `pdserve plan --plot` works from any directory.
#pragma once

namespace pdserve::planner {
// Python 3 source: `python3 script REPORT.json OUT.png`.
const char* GoodputPlotScript();
}  // namespace pdserve::planner
