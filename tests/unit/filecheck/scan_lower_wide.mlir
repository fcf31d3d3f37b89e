// Wide tile accesses (scan.thread {vector_width = 4}, the float32 default): each thread loads 4
// consecutive elements of a stream with one vector.load aligned to 16 bytes, after a check of
// the buffers' alignment (their addresses) and of the tile; the outputs leave the stage by one
// vector.store of 4.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 grid=chunked
// CHECK: gpu.func @scanweaver_blelloch_reduce
// CHECK: memref.extract_aligned_pointer_as_index %reinterpret_cast : memref<?xf32> -> index
// CHECK: vector.load %reinterpret_cast[{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK: vector.load %reinterpret_cast[{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: vector.load %reinterpret_cast_0[{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: vector.store {{%[0-9]+}}, %{{[a-z_0-9]+}}[{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
