// The warp-shuffle tree over 128 threads: five shuffle levels inside each warp (strides 1 to 16,
// every lane at or above the stride working in each of the 4 warps), then one level joining
// the 4 warps in order.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=warp_shuffle block_size=128 elements_per_thread=8
// CHECK: "scan.block"() {threads = 128 : i64, tree = "warp_shuffle"}
// CHECK-NEXT: "scan.sweep"() {active = 124 : i64, phase = "shuffle", stride = 1 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 120 : i64, phase = "shuffle", stride = 2 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 112 : i64, phase = "shuffle", stride = 4 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 96 : i64, phase = "shuffle", stride = 8 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 64 : i64, phase = "shuffle", stride = 16 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 4 : i64, phase = "warps", stride = 32 : i64, via = "shared"}
// CHECK-NEXT: "scan.grid"()
// CHECK-NOT: scan.sweep
