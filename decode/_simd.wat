;; decode/'s pixel loops in WebAssembly (SIMD where it pays), over one memory:
;; - "h" (or "hLast") and "v", the two passes of decode/resize.ts's bilinear resize, with the
;;   same integer arithmetic: 22-bit fixed-point weights, a sum started at half of one, shifted
;;   right by 22 and clamped to 0..255;
;; - "u", PNG's scanline filters undone (decode/png_fast.ts), as the PNG specification
;;   defines them.
;; decode/_simd.ts embeds this module assembled (`deno run -A tools/assemble_wasm.ts` rewrites
;; it from this file) and lays out its memory.
;;
;; The loops read past the last byte they own, and those writing memory 0 write past it (up to
;; 15 bytes); the caller leaves that much slack after every region of memory 0. A store past a
;; row's end lands on the next row, which is written after it.
(module
  ;; Memory 0: this thread's scratch (inputs, taps, intermediate rows); memory 1: the shared
  ;; memory the last pass ("hLast" or "v") writes its output into: the loader's ring, or this
  ;; thread's output memory, copied out from there.
  (import "e" "m" (memory 1))
  (import "e" "r" (memory 1 65536 shared))

  ;; Horizontal pass, 3 or 4 channels: one pixel in the four lanes of a vector (the fourth
  ;; lane of an RGB pixel is the next pixel's red, carried along and never kept).
  ;; src: the region's first byte; stride: bytes per input row; rows: rows to resample;
  ;; c: channels; outW: pixels out per row; start/count: i32 arrays, each output column's
  ;; first input column (relative to the region) and number of taps; wts: i32 weights, tapW
  ;; per output column; dst: rows of outW * c bytes.
  (func (export "h")
    (param $src i32) (param $stride i32) (param $rows i32) (param $c i32) (param $outW i32)
    (param $start i32) (param $count i32) (param $wts i32) (param $tapW i32) (param $dst i32)
    (local $y i32) (local $x i32) (local $i i32) (local $n i32) (local $p i32) (local $wp i32)
    (local $row i32) (local $o i32) (local $acc v128)
    (local.set $o (local.get $dst))
    (block $ydone
      (loop $yloop
        (br_if $ydone (i32.ge_u (local.get $y) (local.get $rows)))
        (local.set $row (i32.add (local.get $src) (i32.mul (local.get $y) (local.get $stride))))
        (local.set $x (i32.const 0))
        (block $xdone
          (loop $xloop
            (br_if $xdone (i32.ge_u (local.get $x) (local.get $outW)))
            (local.set $n
              (i32.load (i32.add (local.get $count) (i32.shl (local.get $x) (i32.const 2)))))
            (local.set $p
              (i32.add
                (local.get $row)
                (i32.mul
                  (i32.load (i32.add (local.get $start) (i32.shl (local.get $x) (i32.const 2))))
                  (local.get $c))))
            (local.set $wp
              (i32.add
                (local.get $wts)
                (i32.shl (i32.mul (local.get $x) (local.get $tapW)) (i32.const 2))))
            (local.set $acc (i32x4.splat (i32.const 2097152)))
            (local.set $i (i32.const 0))
            (block $idone
              (loop $iloop
                (br_if $idone (i32.ge_u (local.get $i) (local.get $n)))
                (local.set $acc
                  (i32x4.add
                    (local.get $acc)
                    (i32x4.mul
                      (i32x4.extend_low_i16x8_u
                        (i16x8.extend_low_i8x16_u (v128.load32_zero (local.get $p))))
                      (i32x4.splat (i32.load (local.get $wp))))))
                (local.set $p (i32.add (local.get $p) (local.get $c)))
                (local.set $wp (i32.add (local.get $wp) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $iloop)))
            (local.set $acc (i32x4.shr_s (local.get $acc) (i32.const 22)))
            (local.set $acc (i16x8.narrow_i32x4_s (local.get $acc) (local.get $acc)))
            (local.set $acc (i8x16.narrow_i16x8_u (local.get $acc) (local.get $acc)))
            (v128.store32_lane 0 (local.get $o) (local.get $acc))
            (local.set $o (i32.add (local.get $o) (local.get $c)))
            (local.set $x (i32.add (local.get $x) (i32.const 1)))
            (br $xloop)))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br $yloop))))

  ;; "h" as the last pass: writing into memory 1 (dst is an address there; tmp, 16 bytes of
  ;; memory 0), never past the output's last byte.
  ;; Horizontal pass, 3 or 4 channels: one pixel in the four lanes of a vector (the fourth
  ;; lane of an RGB pixel is the next pixel's red, carried along and never kept).
  ;; src: the region's first byte; stride: bytes per input row; rows: rows to resample;
  ;; c: channels; outW: pixels out per row; start/count: i32 arrays, each output column's
  ;; first input column (relative to the region) and number of taps; wts: i32 weights, tapW
  ;; per output column; dst: rows of outW * c bytes.
  (func (export "hLast")
    (param $src i32) (param $stride i32) (param $rows i32) (param $c i32) (param $outW i32)
    (param $start i32) (param $count i32) (param $wts i32) (param $tapW i32) (param $dst i32)
    (param $tmp i32)
    (local $end i32) (local $y i32) (local $x i32) (local $i i32) (local $n i32) (local $p i32) (local $wp i32)
    (local $row i32) (local $o i32) (local $acc v128)
    (local.set $o (local.get $dst))
    (local.set $end
      (i32.add
        (local.get $dst)
        (i32.mul (i32.mul (local.get $rows) (local.get $outW)) (local.get $c))))
    (block $ydone
      (loop $yloop
        (br_if $ydone (i32.ge_u (local.get $y) (local.get $rows)))
        (local.set $row (i32.add (local.get $src) (i32.mul (local.get $y) (local.get $stride))))
        (local.set $x (i32.const 0))
        (block $xdone
          (loop $xloop
            (br_if $xdone (i32.ge_u (local.get $x) (local.get $outW)))
            (local.set $n
              (i32.load (i32.add (local.get $count) (i32.shl (local.get $x) (i32.const 2)))))
            (local.set $p
              (i32.add
                (local.get $row)
                (i32.mul
                  (i32.load (i32.add (local.get $start) (i32.shl (local.get $x) (i32.const 2))))
                  (local.get $c))))
            (local.set $wp
              (i32.add
                (local.get $wts)
                (i32.shl (i32.mul (local.get $x) (local.get $tapW)) (i32.const 2))))
            (local.set $acc (i32x4.splat (i32.const 2097152)))
            (local.set $i (i32.const 0))
            (block $idone
              (loop $iloop
                (br_if $idone (i32.ge_u (local.get $i) (local.get $n)))
                (local.set $acc
                  (i32x4.add
                    (local.get $acc)
                    (i32x4.mul
                      (i32x4.extend_low_i16x8_u
                        (i16x8.extend_low_i8x16_u (v128.load32_zero (local.get $p))))
                      (i32x4.splat (i32.load (local.get $wp))))))
                (local.set $p (i32.add (local.get $p) (local.get $c)))
                (local.set $wp (i32.add (local.get $wp) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $iloop)))
            (local.set $acc (i32x4.shr_s (local.get $acc) (i32.const 22)))
            (local.set $acc (i16x8.narrow_i32x4_s (local.get $acc) (local.get $acc)))
            (local.set $acc (i8x16.narrow_i16x8_u (local.get $acc) (local.get $acc)))
            (if (i32.gt_u (i32.add (local.get $o) (i32.const 4)) (local.get $end))
              (then
                ;; The last pixels: exactly c bytes (what follows in memory 1 is not ours).
                (v128.store32_lane 0 (local.get $tmp) (local.get $acc))
                (memory.copy 1 0 (local.get $o) (local.get $tmp) (local.get $c)))
              (else
                (i32.store 1 (local.get $o) (i32x4.extract_lane 0 (local.get $acc)))))
            (local.set $o (i32.add (local.get $o) (local.get $c)))
            (local.set $x (i32.add (local.get $x) (i32.const 1)))
            (br $xloop)))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br $yloop))))

  ;; PNG filters undone: `rows` scanlines at src, each a filter byte and rowBytes bytes, into
  ;; rows of rowBytes bytes at dst; bpp: bytes per pixel (at least 1); zero: rowBytes zero
  ;; bytes (the row above the first). Returns -1, or the first row whose filter type is not
  ;; 0-4.
  (func (export "u")
    (param $src i32) (param $dst i32) (param $zero i32) (param $rows i32) (param $rowBytes i32)
    (param $bpp i32) (result i32)
    (local $y i32) (local $f i32) (local $i i32) (local $prev i32) (local $a i32) (local $b i32)
    (local $c i32) (local $pa i32) (local $pb i32) (local $pc i32)
    (local.set $prev (local.get $zero))
    (block $ydone
      (loop $yloop
        (br_if $ydone (i32.ge_u (local.get $y) (local.get $rows)))
        (local.set $f (i32.load8_u (local.get $src)))
        (local.set $src (i32.add (local.get $src) (i32.const 1)))
        (if (i32.gt_u (local.get $f) (i32.const 4)) (then (return (local.get $y))))
        (if (i32.eqz (local.get $f))
          (then (memory.copy (local.get $dst) (local.get $src) (local.get $rowBytes))))
        ;; Sub: the byte a pixel to the left.
        (if (i32.eq (local.get $f) (i32.const 1))
          (then
            (memory.copy (local.get $dst) (local.get $src) (local.get $bpp))
            (local.set $i (local.get $bpp))
            (block $done
              (loop $next
                (br_if $done (i32.ge_u (local.get $i) (local.get $rowBytes)))
                (i32.store8
                  (i32.add (local.get $dst) (local.get $i))
                  (i32.add
                    (i32.load8_u (i32.add (local.get $src) (local.get $i)))
                    (i32.load8_u
                      (i32.sub (i32.add (local.get $dst) (local.get $i)) (local.get $bpp)))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $next)))))
        ;; Up: the byte above, 16 at a time.
        (if (i32.eq (local.get $f) (i32.const 2))
          (then
            (local.set $i (i32.const 0))
            (block $done
              (loop $next
                (br_if $done (i32.ge_u (local.get $i) (local.get $rowBytes)))
                (v128.store
                  (i32.add (local.get $dst) (local.get $i))
                  (i8x16.add
                    (v128.load (i32.add (local.get $src) (local.get $i)))
                    (v128.load (i32.add (local.get $prev) (local.get $i)))))
                (local.set $i (i32.add (local.get $i) (i32.const 16)))
                (br $next)))))
        ;; Average of left and above.
        (if (i32.eq (local.get $f) (i32.const 3))
          (then
            (local.set $i (i32.const 0))
            (block $done
              (loop $next
                (br_if $done (i32.ge_u (local.get $i) (local.get $rowBytes)))
                (local.set $a
                  (if (result i32) (i32.ge_u (local.get $i) (local.get $bpp))
                    (then
                      (i32.load8_u
                        (i32.sub (i32.add (local.get $dst) (local.get $i)) (local.get $bpp))))
                    (else (i32.const 0))))
                (i32.store8
                  (i32.add (local.get $dst) (local.get $i))
                  (i32.add
                    (i32.load8_u (i32.add (local.get $src) (local.get $i)))
                    (i32.shr_u
                      (i32.add
                        (local.get $a)
                        (i32.load8_u (i32.add (local.get $prev) (local.get $i))))
                      (i32.const 1))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $next)))))
        ;; Paeth: left, above or upper left, whichever is nearest a + b - c.
        (if (i32.eq (local.get $f) (i32.const 4))
          (then
            (local.set $i (i32.const 0))
            (block $done
              (loop $next
                (br_if $done (i32.ge_u (local.get $i) (local.get $rowBytes)))
                (local.set $b (i32.load8_u (i32.add (local.get $prev) (local.get $i))))
                (if (i32.ge_u (local.get $i) (local.get $bpp))
                  (then
                    (local.set $a
                      (i32.load8_u
                        (i32.sub (i32.add (local.get $dst) (local.get $i)) (local.get $bpp))))
                    (local.set $c
                      (i32.load8_u
                        (i32.sub (i32.add (local.get $prev) (local.get $i)) (local.get $bpp)))))
                  (else (local.set $a (i32.const 0)) (local.set $c (i32.const 0))))
                ;; pa = |b - c|, pb = |a - c|, pc = |a + b - 2c|
                (local.set $pa (i32.sub (local.get $b) (local.get $c)))
                (local.set $pb (i32.sub (local.get $a) (local.get $c)))
                (local.set $pc (i32.add (local.get $pa) (local.get $pb)))
                (local.set $pa
                  (select
                    (local.get $pa)
                    (i32.sub (i32.const 0) (local.get $pa))
                    (i32.ge_s (local.get $pa) (i32.const 0))))
                (local.set $pb
                  (select
                    (local.get $pb)
                    (i32.sub (i32.const 0) (local.get $pb))
                    (i32.ge_s (local.get $pb) (i32.const 0))))
                (local.set $pc
                  (select
                    (local.get $pc)
                    (i32.sub (i32.const 0) (local.get $pc))
                    (i32.ge_s (local.get $pc) (i32.const 0))))
                (i32.store8
                  (i32.add (local.get $dst) (local.get $i))
                  (i32.add
                    (i32.load8_u (i32.add (local.get $src) (local.get $i)))
                    (select
                      (local.get $a)
                      (select
                        (local.get $b)
                        (local.get $c)
                        (i32.le_u (local.get $pb) (local.get $pc)))
                      (i32.and
                        (i32.le_u (local.get $pa) (local.get $pb))
                        (i32.le_u (local.get $pa) (local.get $pc))))))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $next)))))
        (local.set $prev (local.get $dst))
        (local.set $dst (i32.add (local.get $dst) (local.get $rowBytes)))
        (local.set $src (i32.add (local.get $src) (local.get $rowBytes)))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br $yloop)))
    (i32.const -1))

  ;; Vertical pass, any channel count, always the last pass: 16 bytes of a row at a time.
  ;; src: the first byte of row 0 of what is resampled in memory 0 (its columns start there);
  ;; stride: bytes per input row; rowLen: bytes per output row; outH: rows out;
  ;; start/count/wts/tapW: each output row's first input row, taps and weights; dst: rows of
  ;; rowLen bytes in memory 1, never written past their last byte; tmp: 16 bytes of memory 0.
  (func (export "v")
    (param $src i32) (param $stride i32) (param $rowLen i32) (param $outH i32)
    (param $start i32) (param $count i32) (param $wts i32) (param $tapW i32) (param $dst i32)
    (param $tmp i32)
    (local $end i32) (local $y i32) (local $x i32) (local $i i32) (local $n i32) (local $p i32) (local $wp i32)
    (local $base i32) (local $wbase i32) (local $o i32)
    (local $w v128) (local $v v128) (local $lo v128) (local $hi v128)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local.set $end
      (i32.add (local.get $dst) (i32.mul (local.get $outH) (local.get $rowLen))))
    (block $ydone
      (loop $yloop
        (br_if $ydone (i32.ge_u (local.get $y) (local.get $outH)))
        (local.set $base
          (i32.add
            (local.get $src)
            (i32.mul
              (i32.load (i32.add (local.get $start) (i32.shl (local.get $y) (i32.const 2))))
              (local.get $stride))))
        (local.set $n
          (i32.load (i32.add (local.get $count) (i32.shl (local.get $y) (i32.const 2)))))
        (local.set $wbase
          (i32.add
            (local.get $wts)
            (i32.shl (i32.mul (local.get $y) (local.get $tapW)) (i32.const 2))))
        (local.set $o (i32.add (local.get $dst) (i32.mul (local.get $y) (local.get $rowLen))))
        (local.set $x (i32.const 0))
        (block $xdone
          (loop $xloop
            (br_if $xdone (i32.ge_u (local.get $x) (local.get $rowLen)))
            (local.set $a0 (i32x4.splat (i32.const 2097152)))
            (local.set $a1 (local.get $a0))
            (local.set $a2 (local.get $a0))
            (local.set $a3 (local.get $a0))
            (local.set $p (i32.add (local.get $base) (local.get $x)))
            (local.set $wp (local.get $wbase))
            (local.set $i (i32.const 0))
            (block $idone
              (loop $iloop
                (br_if $idone (i32.ge_u (local.get $i) (local.get $n)))
                (local.set $w (i32x4.splat (i32.load (local.get $wp))))
                (local.set $v (v128.load (local.get $p)))
                (local.set $lo (i16x8.extend_low_i8x16_u (local.get $v)))
                (local.set $hi (i16x8.extend_high_i8x16_u (local.get $v)))
                (local.set $a0
                  (i32x4.add
                    (local.get $a0)
                    (i32x4.mul (i32x4.extend_low_i16x8_u (local.get $lo)) (local.get $w))))
                (local.set $a1
                  (i32x4.add
                    (local.get $a1)
                    (i32x4.mul (i32x4.extend_high_i16x8_u (local.get $lo)) (local.get $w))))
                (local.set $a2
                  (i32x4.add
                    (local.get $a2)
                    (i32x4.mul (i32x4.extend_low_i16x8_u (local.get $hi)) (local.get $w))))
                (local.set $a3
                  (i32x4.add
                    (local.get $a3)
                    (i32x4.mul (i32x4.extend_high_i16x8_u (local.get $hi)) (local.get $w))))
                (local.set $p (i32.add (local.get $p) (local.get $stride)))
                (local.set $wp (i32.add (local.get $wp) (i32.const 4)))
                (local.set $i (i32.add (local.get $i) (i32.const 1)))
                (br $iloop)))
            (local.set $v
              (i8x16.narrow_i16x8_u
                (i16x8.narrow_i32x4_s
                  (i32x4.shr_s (local.get $a0) (i32.const 22))
                  (i32x4.shr_s (local.get $a1) (i32.const 22)))
                (i16x8.narrow_i32x4_s
                  (i32x4.shr_s (local.get $a2) (i32.const 22))
                  (i32x4.shr_s (local.get $a3) (i32.const 22)))))
            (if (i32.gt_u (i32.add (i32.add (local.get $o) (local.get $x)) (i32.const 16))
                  (local.get $end))
              (then
                ;; Near the output's end: only this row's bytes (what follows is not ours).
                (v128.store (local.get $tmp) (local.get $v))
                (memory.copy 1 0
                  (i32.add (local.get $o) (local.get $x))
                  (local.get $tmp)
                  (select
                    (i32.const 16)
                    (i32.sub (local.get $rowLen) (local.get $x))
                    (i32.gt_u (i32.sub (local.get $rowLen) (local.get $x)) (i32.const 16)))))
              (else (v128.store 1 (i32.add (local.get $o) (local.get $x)) (local.get $v))))
            (local.set $x (i32.add (local.get $x) (i32.const 16)))
            (br $xloop)))
        (local.set $y (i32.add (local.get $y) (i32.const 1)))
        (br $yloop)))))
