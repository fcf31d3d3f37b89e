// 16-bit inputs of the affine scan, tile_layout left open: the plain and short kernels load
// their tiles direct (into registers, no stage), the look-back kernel packs its stage (the
// 16-bit values as loaded, read back in 16-byte vectors).
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch dtype=bfloat16
// CHECK: "scan.thread"() {elements = 16 : i64, layout = "direct"
// CHECK-NEXT: "scan.block"() {threads = 64 : i64, tree = "blelloch"}
// CHECK: "scan.grid"() {{{.*}}scheme = "lookback", tile = 4096 : i64
// CHECK-NEXT: "scan.lookback"() {elements = 32 : i64, lanes = 32 : i64, layout = "packed", threads = 128 : i64, tiles_per_lane = 1 : i64}
// CHECK-NEXT: "scan.short"() {elements = 16 : i64, layout = "direct", longest = 4096 : i64, threads = 32 : i64}
