// vector_width=1: the plan's tiles move one element an access (scan.thread {vector_width = 1}).
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=kogge_stone block_size=64 vector_width=1
// CHECK: "scan.thread"() {elements = 8 : i64, layout = "staged", vector_width = 1 : i64}
