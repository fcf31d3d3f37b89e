// Kogge-Stone over 64 threads: six levels, every thread i >= stride working.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=kogge_stone block_size=64 elements_per_thread=8
// CHECK: "scan.block"() {threads = 64 : i64, tree = "kogge_stone"}
// CHECK-NEXT: "scan.sweep"() {active = 63 : i64, phase = "scan", stride = 1 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 62 : i64, phase = "scan", stride = 2 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 60 : i64, phase = "scan", stride = 4 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 56 : i64, phase = "scan", stride = 8 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 48 : i64, phase = "scan", stride = 16 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 32 : i64, phase = "scan", stride = 32 : i64, via = "shared"}
// CHECK-NEXT: "scan.grid"()
// CHECK-NOT: scan.sweep
