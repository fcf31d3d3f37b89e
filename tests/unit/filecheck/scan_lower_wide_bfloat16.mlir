// Wide tile accesses of 16-bit buffers (vector_width = 8, 16 bytes): the lowering's vector<8xf32>
// accesses become vector<8xbf16> ones (their claimed alignment halved with the element: 16
// bytes). A load is widened as four 32-bit words: the low element of a word is the word shifted
// left by 16 bits, the high one the word with its low half cleared, put back in order by one
// shuffle; a store is rounded (arith.truncf) as a vector.
// RUN: scan-lower  recurrence="h[t] = a[t] * h[t-1] + b[t]" strategy=blelloch block_size=32 dtype=bfloat16 grid=lookback
// CHECK: [[RA:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg0
// CHECK: [[RH:%reinterpret_cast[_0-9]*]] = memref.reinterpret_cast %arg3
// CHECK: memref.extract_aligned_pointer_as_index [[RA]] : memref<?xbf16> -> index
// CHECK: [[A:%[0-9]+]] = vector.load [[RA]][{{.*}}] {alignment = 16 : i64} : memref<?xbf16>, vector<8xbf16>
// CHECK-NEXT: [[W:%[0-9]+]] = vector.bitcast [[A]] : vector<8xbf16> to vector<4xi32>
// CHECK: [[LO:%[0-9]+]] = arith.shli [[W]], %{{.*}} : vector<4xi32>
// CHECK-NEXT: [[LF:%[0-9]+]] = vector.bitcast [[LO]] : vector<4xi32> to vector<4xf32>
// CHECK: [[HI:%[0-9]+]] = arith.andi [[W]], %{{.*}} : vector<4xi32>
// CHECK-NEXT: [[HF:%[0-9]+]] = vector.bitcast [[HI]] : vector<4xi32> to vector<4xf32>
// CHECK-NEXT: vector.shuffle [[LF]], [[HF]] [0, 4, 1, 5, 2, 6, 3, 7] : vector<4xf32>, vector<4xf32>
// CHECK: [[H:%[0-9]+]] = arith.truncf {{.*}} : vector<8xf32> to vector<8xbf16>
// CHECK-NEXT: vector.store [[H]], [[RH]][{{.*}}] {alignment = 16 : i64} : memref<?xbf16>, vector<8xbf16>
