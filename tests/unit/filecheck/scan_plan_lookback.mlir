// The single-pass look-back grid of a tree: chunks of one tile (or the whole sequence from a
// tenth of the block slots in sequences, as the chunked grid). A scalar first-order state's
// look-back kernel composes twice the plain kernel's elements a thread (lookback_elements
// "auto") in blocks of at least 256 threads (lookback_threads "auto", 16 elements a thread on
// the GPU): its tile is 256 threads x 16 elements, while whole sequences keep 64 x 8; on the
// GPU its float32 tile is packed (lookback_layout "auto"), copied into the stage asynchronously.
// RUN: scan-plan  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=kogge_stone block_size=64 elements_per_thread=8 grid=lookback
// CHECK: "scan.thread"() {elements = 8 : i64, layout = "staged", vector_width = 4 : i64}
// CHECK-NEXT: "scan.block"() {threads = 64 : i64, tree = "kogge_stone"}
// CHECK-COUNT-6: "scan.sweep"() {{{.*}}phase = "scan"
// CHECK-NEXT: "scan.grid"() {direction = "forward", fill = {{.*}}, min_tiles = 1 : i64, scheme = "lookback", tile = 4096 : i64, unchunked_from = 1.000000e-01 : f64}
// CHECK-NEXT: "scan.lookback"() {elements = 16 : i64, lanes = 32 : i64, layout = "packed", threads = 256 : i64, tiles_per_lane = 1 : i64}
