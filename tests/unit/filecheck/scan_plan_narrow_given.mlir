// A given tile_layout is every kernel's: 16-bit inputs with tile_layout=staged stage the plain,
// look-back and short kernels' tiles alike.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch dtype=float16 tile_layout=staged
// CHECK: "scan.thread"() {elements = 16 : i64, layout = "staged"
// CHECK: "scan.lookback"() {{{.*}}layout = "staged"
// CHECK-NEXT: "scan.short"() {{{.*}}layout = "staged"
