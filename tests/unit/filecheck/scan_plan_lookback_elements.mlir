// lookback_elements set: the look-back kernel's tile is lookback_threads x lookback_elements, for
// any state (here a second-order one, whose "auto" would keep elements_per_thread); its threads
// stay block_size's ("auto" takes more only for tiles of 16 elements a thread).
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + c[t] * h[t-2] + b[t]" strategy=blelloch block_size=32 elements_per_thread=4 grid=lookback lookback_elements=8
// CHECK: "scan.thread"() {elements = 4 : i64, layout = "staged", vector_width = 4 : i64}
// CHECK: "scan.grid"() {{{.*}}scheme = "lookback", tile = 256 : i64
// CHECK-NEXT: "scan.lookback"() {elements = 8 : i64, lanes = 32 : i64, layout = "staged", threads = 32 : i64, tiles_per_lane = 1 : i64}
