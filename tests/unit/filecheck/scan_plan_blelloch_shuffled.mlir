// Blelloch over 64 threads on the GPU (warp_sweeps="auto"): the levels whose pairs lie inside
// one warp (strides 1..16) trade their values by shuffles, the root's level (stride 32, across
// the two warps) goes through shared memory.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=64 elements_per_thread=4 grid=chunked
// CHECK: "scan.block"() {threads = 64 : i64, tree = "blelloch"}
// CHECK-NEXT: "scan.sweep"() {active = 32 : i64, phase = "up", stride = 1 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 16 : i64, phase = "up", stride = 2 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 8 : i64, phase = "up", stride = 4 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 4 : i64, phase = "up", stride = 8 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 2 : i64, phase = "up", stride = 16 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 1 : i64, phase = "up_root", stride = 32 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 2 : i64, phase = "down", stride = 16 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 4 : i64, phase = "down", stride = 8 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 8 : i64, phase = "down", stride = 4 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 16 : i64, phase = "down", stride = 2 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 32 : i64, phase = "down", stride = 1 : i64, via = "shuffle"}
// CHECK-NEXT: "scan.grid"()
