// The sequential strategy: warp tiles staged through shared memory, no tree.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=sequential block_size=64
// CHECK: "scan.warp_tile"() {sequences = 32 : i64, steps = 32 : i64}
// CHECK-NEXT: "scan.block"() {threads = 64 : i64, tree = "none"}
// CHECK-NOT: scan.sweep
// CHECK: "scan.grid"() {{{.*}}scheme = "sequence-per-thread"
