// Wide tile accesses (scan.thread {vector_width = 4}, the float32 default): each thread loads 4
// consecutive elements of a stream with one vector.load aligned to 16 bytes, after a check of
// the buffers' alignment (their addresses) and of the tile; the outputs leave the stage by one
// vector.store of 4.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 grid=chunked
// CHECK: gpu.func @scanweaver_blelloch_reduce
// CHECK: [[RA:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg0
// CHECK: memref.extract_aligned_pointer_as_index [[RA]] : memref<?xf32> -> index
// CHECK: vector.load [[RA]][{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: gpu.func @scanweaver_blelloch(
// CHECK: [[A:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg0
// CHECK: [[B:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg1
// CHECK: vector.load [[A]][{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: vector.load [[B]][{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
// CHECK: vector.store {{%[0-9]+}}, %{{[a-z_0-9]+}}[{{.*}}] {alignment = 16 : i64} : memref<?xf32>, vector<4xf32>
