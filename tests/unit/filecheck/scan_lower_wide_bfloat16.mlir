// Wide tile accesses of 16-bit buffers (vector_width = 8, 16 bytes): the lowering's vector<8xf32>
// accesses become vector<8xbf16> ones (their claimed alignment halved with the element: 16
// bytes), extended (arith.extf) or rounded (arith.truncf) as vectors.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 dtype=bfloat16 grid=lookback
// CHECK: [[RA:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg0
// CHECK: [[RH:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg3
// CHECK: memref.extract_aligned_pointer_as_index [[RA]] : memref<?xbf16> -> index
// CHECK: [[A:%[0-9]+]] = vector.load [[RA]][{{.*}}] {alignment = 16 : i64} : memref<?xbf16>, vector<8xbf16>
// CHECK-NEXT: arith.extf [[A]] : vector<8xbf16> to vector<8xf32>
// CHECK: [[H:%[0-9]+]] = arith.truncf {{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK-NEXT: vector.store [[H]], [[RH]][{{.*}}] {alignment = 16 : i64} : memref<?xbf16>, vector<8xbf16>
