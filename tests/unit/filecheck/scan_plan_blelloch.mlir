// Blelloch over 32 threads of 4 elements, every level in shared memory (warp_sweeps=shared):
// up-sweep strides 1..16 (the last also swaps the root), down-sweep strides 8..1, then the
// chunked grid scheme.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 elements_per_thread=4 chunk_tiles=2 grid=chunked warp_sweeps=shared
// CHECK: "scan.affine"()
// CHECK-NEXT: "scan.thread"() {elements = 4 : i64, layout = "staged", vector_width = 4 : i64}
// CHECK-NEXT: "scan.block"() {threads = 32 : i64, tree = "blelloch"}
// CHECK-NEXT: "scan.sweep"() {active = 16 : i64, phase = "up", stride = 1 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 8 : i64, phase = "up", stride = 2 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 4 : i64, phase = "up", stride = 4 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 2 : i64, phase = "up", stride = 8 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 1 : i64, phase = "up_root", stride = 16 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 2 : i64, phase = "down", stride = 8 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 4 : i64, phase = "down", stride = 4 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 8 : i64, phase = "down", stride = 2 : i64, via = "shared"}
// CHECK-NEXT: "scan.sweep"() {active = 16 : i64, phase = "down", stride = 1 : i64, via = "shared"}
// CHECK-NEXT: "scan.grid"() {{{.*}}min_tiles = 2 : i64, scheme = "chunked", tile = 128 : i64
