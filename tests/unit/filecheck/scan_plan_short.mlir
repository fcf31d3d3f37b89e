// The open scalar tile on the GPU: 64 threads x 16 elements, and a short kernel of 32 x 16 for
// sequences of at most 4096 steps (the look-back grid's tile).
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch
// CHECK: "scan.thread"() {elements = 16 : i64
// CHECK-NEXT: "scan.block"() {threads = 64 : i64, tree = "blelloch"}
// CHECK: "scan.grid"() {{{.*}}scheme = "lookback", tile = 4096 : i64
// CHECK: "scan.short"() {elements = 16 : i64, layout = "staged", longest = 4096 : i64, threads = 32 : i64}
// CHECK-NEXT: "scan.store"()
