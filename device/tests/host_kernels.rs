//! The device kernels (kernels/cuda/*.cu compiled for the host with the
//! `SNCL_HOST_EMU` shim) against the CPU kernels, bit for bit: every
//! (dtype, op) pair and divide, random data with NaN, ±inf, -0.0,
//! subnormals and integer extremes, sizes around the 16-byte pack and the
//! grid, aligned and misaligned buffers, several launch shapes, 1 to 8
//! sources, 1 to 3 destinations, in place.
//!
//! The reference is the CPU fold: `kernels::copy` for one source, else
//! `kernels::reduce_into` left to right, and `kernels::divide`.
//!
//! The one leeway is the CPU's, not the kernels': a float sum or product
//! where two NaN (or NaN-making infinite) inputs meet must be *a* NaN, but
//! its payload may differ, because the Rust compiler is free to commute the
//! CPU reference's operands (see kernels/tests/simd_vs_scalar.rs). The
//! kernels always give x86's answer for the operands in fold order.

#[cfg(not(feature = "emu"))]
#[test]
fn needs_the_emu_feature() {
    eprintln!("skipped: the host-compiled kernels need `--features emu`");
}

#[cfg(feature = "emu")]
mod with_emu {
    use device::emu::hostkernels::{divide_with_shape, reduce_copy_with_shape, LaunchShape};
    use kernels::{DataType, ReduceOp};

    const SHAPES: [LaunchShape; 3] = [
        LaunchShape { grid: 1, block: 1 },
        LaunchShape { grid: 3, block: 32 },
        LaunchShape {
            grid: 64,
            block: 256,
        },
    ];

    /// splitmix64: a small deterministic generator (seeded per case, so a
    /// failure names a reproducible case).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn pick<T: Copy>(&mut self, list: &[T]) -> T {
            list[self.below(list.len() as u64) as usize]
        }
    }

    const F32_SPECIAL: &[u64] = &[
        0x0000_0000, // +0
        0x8000_0000, // -0
        0x7f80_0000, // +inf
        0xff80_0000, // -inf
        0x7fc0_0000, // qNaN
        0xffc0_0000, // -qNaN (x86 default NaN)
        0x7f80_0001, // sNaN
        0x7fff_ffff, // NaN, full payload
        0xff81_2345, // -sNaN with payload
        0x0000_0001, // smallest subnormal
        0x007f_ffff, // largest subnormal
        0x8000_0001, // -smallest subnormal
        0x0080_0000, // MIN_POSITIVE
        0x7f7f_ffff, // MAX
        0xff7f_ffff, // -MAX
        0x3f80_0000, // 1.0
        0xbf80_0000, // -1.0
        0x3f80_8000, // bf16 tie, rounds down to even
        0x3f81_8000, // bf16 tie, rounds up to even
        0x477f_f000, // f16 tie at MAX, rounds to inf
        0x3300_0000, // 2^-25, f16 tie to 0
        0x3300_0001, // just above 2^-25
    ];

    const F64_SPECIAL: &[u64] = &[
        0,
        0x8000_0000_0000_0000,
        0x7ff0_0000_0000_0000,
        0xfff0_0000_0000_0000,
        0x7ff8_0000_0000_0000,
        0xfff8_0000_0000_0000,
        0x7ff0_0000_0000_0001,
        0x7fff_ffff_ffff_ffff,
        1,
        0x000f_ffff_ffff_ffff,
        0x8000_0000_0000_0001,
        0x0010_0000_0000_0000,
        0x7fef_ffff_ffff_ffff,
        0xffef_ffff_ffff_ffff,
        0x3ff0_0000_0000_0000,
        0xbff0_0000_0000_0000,
    ];

    const F16_SPECIAL: &[u64] = &[
        0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfd23, 0x7fff, 0x0001, 0x03ff,
        0x8001, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x3c01, 0x0200,
    ];

    const BF16_SPECIAL: &[u64] = &[
        0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff92, 0x7fff, 0x0001, 0x007f,
        0x8001, 0x0080, 0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x3f81, 0x4000,
    ];

    /// Integer extremes (truncated to the element width).
    const INT_SPECIAL: &[u64] = &[
        0,
        1,
        u64::MAX,
        0x7f,
        0x80,
        0xff,
        0x7fff_ffff,
        0x8000_0000,
        0xffff_ffff,
        0x7fff_ffff_ffff_ffff,
        0x8000_0000_0000_0000,
    ];

    fn width_mask(dtype: DataType) -> u64 {
        match dtype.size() {
            8 => u64::MAX,
            w => (1u64 << (8 * w)) - 1,
        }
    }

    /// A random element's bits: one in eight from the special values, else a
    /// moderate value (floats with exponents near 1, so sums and products stay
    /// mostly finite) or random integer bits.
    fn random_bits(rng: &mut Rng, dtype: DataType) -> u64 {
        let special = rng.below(8) == 0;
        let r = rng.next();
        match dtype {
            DataType::Float32 if special => rng.pick(F32_SPECIAL),
            DataType::Float64 if special => rng.pick(F64_SPECIAL),
            DataType::Float16 if special => rng.pick(F16_SPECIAL),
            DataType::Bfloat16 if special => rng.pick(BF16_SPECIAL),
            _ if special => rng.pick(INT_SPECIAL) & width_mask(dtype),
            // sign | exponent in bias±8 | mantissa
            DataType::Float32 => {
                (r & 0x8000_0000) | ((119 + (r >> 40) % 17) << 23) | (r & 0x7f_ffff)
            }
            DataType::Float64 => {
                (r & (1 << 63)) | ((1015 + (r >> 40) % 17) << 52) | (r & 0xf_ffff_ffff_ffff)
            }
            DataType::Float16 => (r & 0x8000) | ((7 + (r >> 40) % 17) << 10) | (r & 0x3ff),
            DataType::Bfloat16 => (r & 0x8000) | ((119 + (r >> 40) % 17) << 7) | (r & 0x7f),
            _ => r & width_mask(dtype),
        }
    }

    fn read(dtype: DataType, buf: &[u8], i: usize) -> u64 {
        let w = dtype.size();
        let mut b = [0u8; 8];
        b[..w].copy_from_slice(&buf[i * w..(i + 1) * w]);
        u64::from_le_bytes(b)
    }

    fn write(dtype: DataType, buf: &mut [u8], i: usize, bits: u64) {
        let w = dtype.size();
        buf[i * w..(i + 1) * w].copy_from_slice(&bits.to_le_bytes()[..w]);
    }

    fn is_nan(dtype: DataType, bits: u64) -> bool {
        match dtype {
            DataType::Float32 => f32::from_bits(bits as u32).is_nan(),
            DataType::Float64 => f64::from_bits(bits).is_nan(),
            DataType::Float16 => bits & 0x7fff > 0x7c00,
            DataType::Bfloat16 => bits & 0x7fff > 0x7f80,
            DataType::Float8e4m3 => bits & 0x7f == 0x7f,
            DataType::Float8e5m2 => bits & 0x7f > 0x7c,
            _ => false,
        }
    }

    fn is_nan_or_inf(dtype: DataType, bits: u64) -> bool {
        match dtype {
            DataType::Float32 => !f32::from_bits(bits as u32).is_finite(),
            DataType::Float64 => !f64::from_bits(bits).is_finite(),
            DataType::Float16 => bits & 0x7c00 == 0x7c00,
            DataType::Bfloat16 => bits & 0x7f80 == 0x7f80,
            DataType::Float8e4m3 => bits & 0x7f == 0x7f,
            DataType::Float8e5m2 => bits & 0x7c == 0x7c,
            _ => false,
        }
    }

    /// A byte buffer whose data starts `misalign` bytes past a 16-byte boundary.
    struct Buf {
        storage: Vec<u8>,
        off: usize,
        len: usize,
    }

    impl Buf {
        fn new(len: usize, misalign: usize) -> Buf {
            let storage = vec![0u8; len + 32];
            let off = (16 - storage.as_ptr() as usize % 16) % 16 + misalign;
            Buf { storage, off, len }
        }
        fn bytes(&self) -> &[u8] {
            &self.storage[self.off..self.off + self.len]
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            &mut self.storage[self.off..self.off + self.len]
        }
    }

    /// Every pair the device has a kernel for (avg runs the sum kernel).
    fn pairs() -> Vec<(DataType, ReduceOp)> {
        DataType::ALL
            .into_iter()
            .flat_map(|d| ReduceOp::ALL.into_iter().map(move |o| (d, o)))
            .filter(|(d, o)| o.supports(*d))
            .collect()
    }

    /// The CPU's answer: copy, or reduce_into left to right.
    fn cpu_fold(dtype: DataType, op: ReduceOp, srcs: &[Vec<u8>]) -> Vec<u8> {
        let mut acc = vec![0u8; srcs[0].len()];
        kernels::copy(&mut acc, &srcs[0]);
        for src in &srcs[1..] {
            let mut next = vec![0u8; acc.len()];
            kernels::reduce_into(dtype, op, &mut next, &acc, src);
            acc = next;
        }
        acc
    }

    /// Compares a kernel result with the CPU's, element by element; `inputs`
    /// are the sources (for the NaN leeway and the failure message).
    fn compare(
        what: &str,
        dtype: DataType,
        op: ReduceOp,
        expected: &[u8],
        actual: &[u8],
        inputs: &[Vec<u8>],
    ) -> Result<(), String> {
        let arithmetic =
            dtype.is_float() && matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Prod);
        for i in 0..expected.len() / dtype.size() {
            let (e, a) = (read(dtype, expected, i), read(dtype, actual, i));
            if e == a {
                continue;
            }
            let ins: Vec<u64> = inputs.iter().map(|s| read(dtype, s, i)).collect();
            let nan_meetings = ins.iter().filter(|&&x| is_nan_or_inf(dtype, x)).count();
            if arithmetic && is_nan(dtype, e) && is_nan(dtype, a) && nan_meetings >= 2 {
                continue;
            }
            return Err(format!(
                "{what}: {} {} element {i}: inputs {ins:x?}: CPU {e:#x}, kernel {a:#x}",
                dtype.name(),
                op.name()
            ));
        }
        Ok(())
    }

    /// One reduce-copy case; returns a description of the first mismatch.
    #[allow(clippy::too_many_arguments)]
    fn run_case(
        seed: u64,
        dtype: DataType,
        op: ReduceOp,
        count: usize,
        nsrcs: usize,
        ndsts: usize,
        misalign: &[usize],
        in_place: bool,
        shape: LaunchShape,
    ) -> Result<(), String> {
        let what = format!(
        "seed {seed} count {count} {nsrcs} src {ndsts} dst misalign {misalign:?} in_place {in_place} shape {}x{}",
        shape.grid, shape.block
    );
        let bytes = count * dtype.size();
        let mut rng = Rng(seed);
        let mut srcs: Vec<Buf> = (0..nsrcs)
            .map(|k| Buf::new(bytes, misalign[k % misalign.len()]))
            .collect();
        for s in &mut srcs {
            for i in 0..count {
                let bits = random_bits(&mut rng, dtype);
                write(dtype, s.bytes_mut(), i, bits);
            }
        }
        let inputs: Vec<Vec<u8>> = srcs.iter().map(|s| s.bytes().to_vec()).collect();
        let expected = cpu_fold(dtype, op, &inputs);
        let mut dsts: Vec<Buf> = (0..ndsts)
            .map(|j| Buf::new(bytes, misalign[(nsrcs + j) % misalign.len()]))
            .collect();
        for d in &mut dsts {
            d.bytes_mut().fill(0xa5);
        }
        let src_ptrs: Vec<*const u8> = srcs.iter().map(|s| s.bytes().as_ptr()).collect();
        let mut dst_ptrs: Vec<*mut u8> = dsts
            .iter_mut()
            .map(|d| d.bytes_mut().as_mut_ptr())
            .collect();
        // In place: the first destination is the last source.
        if in_place {
            dst_ptrs[0] = srcs[nsrcs - 1].bytes_mut().as_mut_ptr();
        }
        // SAFETY: every pointer covers `bytes` bytes of a live buffer; the only
        // overlap is the in-place destination, which equals a source exactly.
        unsafe { reduce_copy_with_shape(dtype, op, &src_ptrs, &dst_ptrs, count, shape) }
            .map_err(|e| format!("{what}: {e}"))?;
        for (j, d) in dsts.iter().enumerate() {
            let actual = if in_place && j == 0 {
                srcs[nsrcs - 1].bytes()
            } else {
                d.bytes()
            };
            compare(
                &format!("{what} dst {j}"),
                dtype,
                op,
                &expected,
                actual,
                &inputs,
            )?;
        }
        Ok(())
    }

    /// Sizes: empty, one element, one short of a pack-ish 7, a prime, one
    /// grid's worth of packs plus a tail.
    fn sizes(dtype: DataType, shape: LaunchShape) -> [usize; 5] {
        let grid_elems = (shape.grid * shape.block) as usize * (16 / dtype.size());
        [0, 1, 7, 4099, grid_elems + 13]
    }

    #[test]
    fn reduce_copy_matches_the_cpu_fold() {
        // 0: every buffer aligned (the 16-byte pack path); 1 element or 8 bytes
        // off (the scalar path); one buffer off among aligned ones.
        let alignments = |dtype: DataType| -> [Vec<usize>; 4] {
            [vec![0], vec![dtype.size()], vec![8], vec![0, 0, 8]]
        };
        let mut failures = Vec::new();
        let mut cases = 0;
        for (p, (dtype, op)) in pairs().into_iter().enumerate() {
            let mut i = p;
            for shape in SHAPES {
                for count in sizes(dtype, shape) {
                    i += 1;
                    let nsrcs = 1 + i % 8;
                    let ndsts = 1 + (i / 8) % 3;
                    let misalign = &alignments(dtype)[i % 4];
                    let in_place = i % 3 == 0;
                    cases += 1;
                    if let Err(e) = run_case(
                        i as u64 * 7919 + p as u64,
                        dtype,
                        op,
                        count,
                        nsrcs,
                        ndsts,
                        misalign,
                        in_place,
                        shape,
                    ) {
                        failures.push(e);
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {cases} cases differ:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn every_source_and_destination_count() {
        let mut failures = Vec::new();
        for (dtype, op) in [
            (DataType::Float32, ReduceOp::Sum),
            (DataType::Bfloat16, ReduceOp::Prod),
            (DataType::Float16, ReduceOp::Min),
            (DataType::Int8, ReduceOp::BitXor),
            (DataType::Uint64, ReduceOp::Max),
            (DataType::Float8e4m3, ReduceOp::Sum),
            (DataType::Float8e5m2, ReduceOp::Prod),
        ] {
            for nsrcs in 1..=8 {
                for ndsts in 1..=3 {
                    for (misalign, in_place) in [
                        (vec![0], false),
                        (vec![0], true),
                        (vec![dtype.size()], true),
                    ] {
                        let seed = (nsrcs * 10 + ndsts) as u64;
                        let shape = LaunchShape { grid: 3, block: 32 };
                        if let Err(e) = run_case(
                            seed, dtype, op, 1031, nsrcs, ndsts, &misalign, in_place, shape,
                        ) {
                            failures.push(e);
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Every f16 and bf16 bit pattern against every special value: the
    /// conversions, rounding and NaN rules for the whole 16-bit space.
    #[test]
    fn half_types_exhaustive() {
        for (dtype, specials) in [
            (DataType::Float16, F16_SPECIAL),
            (DataType::Bfloat16, BF16_SPECIAL),
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                for &b in specials {
                    let count = 1 << 16;
                    let mut x = Buf::new(count * 2, 0);
                    let mut y = Buf::new(count * 2, 0);
                    for i in 0..count {
                        write(dtype, x.bytes_mut(), i, i as u64);
                        write(dtype, y.bytes_mut(), i, b);
                    }
                    for (first, second) in [(&x, &y), (&y, &x)] {
                        let inputs = vec![first.bytes().to_vec(), second.bytes().to_vec()];
                        let expected = cpu_fold(dtype, op, &inputs);
                        let mut out = Buf::new(count * 2, 0);
                        let srcs = [first.bytes().as_ptr(), second.bytes().as_ptr()];
                        let shape = LaunchShape { grid: 8, block: 64 };
                        // SAFETY: all three buffers hold `count` elements.
                        unsafe {
                            reduce_copy_with_shape(
                                dtype,
                                op,
                                &srcs,
                                &[out.bytes_mut().as_mut_ptr()],
                                count,
                                shape,
                            )
                        }
                        .expect("launch");
                        if let Err(e) =
                            compare("exhaustive", dtype, op, &expected, out.bytes(), &inputs)
                        {
                            panic!("{e}");
                        }
                    }
                }
            }
            // Divide every pattern by a few rank counts.
            for n in [1usize, 3, 7, 256, 1 << 40] {
                let count = 1 << 16;
                let mut x = Buf::new(count * 2, 0);
                for i in 0..count {
                    write(dtype, x.bytes_mut(), i, i as u64);
                }
                let mut expected = x.bytes().to_vec();
                kernels::divide(dtype, &mut expected, n);
                let shape = LaunchShape { grid: 4, block: 32 };
                // SAFETY: `x` holds `count` elements.
                unsafe { divide_with_shape(dtype, x.bytes_mut().as_mut_ptr(), count, n, shape) }
                    .expect("launch");
                if let Err(e) = compare(
                    &format!("divide by {n}"),
                    dtype,
                    ReduceOp::Max,
                    &expected,
                    x.bytes(),
                    &[],
                ) {
                    panic!("{e}");
                }
            }
        }
    }

    /// Every pair of fp8 bit patterns (so every pattern against every
    /// special: ±0, subnormals, ±max, inf, NaN), every op, and every pattern
    /// divided by a few rank counts: the decode, the rounding, the
    /// saturation and the NaN rules over the whole 8-bit space.
    #[test]
    fn fp8_every_pair() {
        for dtype in [DataType::Float8e4m3, DataType::Float8e5m2] {
            let count = 1 << 16;
            let mut x = Buf::new(count, 0);
            let mut y = Buf::new(count, 3);
            for i in 0..count {
                x.bytes_mut()[i] = (i >> 8) as u8;
                y.bytes_mut()[i] = i as u8;
            }
            let inputs = vec![x.bytes().to_vec(), y.bytes().to_vec()];
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let expected = cpu_fold(dtype, op, &inputs);
                for misalign in [0, 5] {
                    // Aligned: the x/out pack path is taken only when y is
                    // aligned too, so also run it with y's copy aligned.
                    let mut y0 = Buf::new(count, misalign);
                    y0.bytes_mut().copy_from_slice(y.bytes());
                    let mut out = Buf::new(count, misalign);
                    let srcs = [x.bytes().as_ptr(), y0.bytes().as_ptr()];
                    // SAFETY: all three buffers hold `count` elements.
                    unsafe {
                        reduce_copy_with_shape(
                            dtype,
                            op,
                            &srcs,
                            &[out.bytes_mut().as_mut_ptr()],
                            count,
                            SHAPES[2],
                        )
                    }
                    .expect("launch");
                    if let Err(e) = compare("fp8 pairs", dtype, op, &expected, out.bytes(), &inputs)
                    {
                        panic!("{e}");
                    }
                }
            }
            for n in [1usize, 2, 3, 7, 256, 1 << 40] {
                let mut buf = Buf::new(256, 0);
                for i in 0..256 {
                    buf.bytes_mut()[i] = i as u8;
                }
                let mut expected = buf.bytes().to_vec();
                kernels::divide(dtype, &mut expected, n);
                // SAFETY: `buf` holds 256 elements.
                unsafe {
                    divide_with_shape(dtype, buf.bytes_mut().as_mut_ptr(), 256, n, SHAPES[1])
                }
                .expect("launch");
                let what = format!("fp8 divide by {n}");
                if let Err(e) = compare(&what, dtype, ReduceOp::Max, &expected, buf.bytes(), &[]) {
                    panic!("{e}");
                }
            }
        }
    }

    /// Every pair of f32/f64 special values, both orders: the NaN rules of
    /// sum/prod/max/min on their own.
    #[test]
    fn float_specials_pairwise() {
        for (dtype, specials) in [
            (DataType::Float32, F32_SPECIAL),
            (DataType::Float64, F64_SPECIAL),
        ] {
            let n = specials.len();
            let count = n * n;
            let bytes = count * dtype.size();
            let mut x = Buf::new(bytes, 0);
            let mut y = Buf::new(bytes, 0);
            for i in 0..n {
                for j in 0..n {
                    write(dtype, x.bytes_mut(), i * n + j, specials[i]);
                    write(dtype, y.bytes_mut(), i * n + j, specials[j]);
                }
            }
            let inputs = vec![x.bytes().to_vec(), y.bytes().to_vec()];
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let expected = cpu_fold(dtype, op, &inputs);
                let mut out = Buf::new(bytes, 0);
                let srcs = [x.bytes().as_ptr(), y.bytes().as_ptr()];
                // SAFETY: all three buffers hold `count` elements.
                unsafe {
                    reduce_copy_with_shape(
                        dtype,
                        op,
                        &srcs,
                        &[out.bytes_mut().as_mut_ptr()],
                        count,
                        SHAPES[1],
                    )
                }
                .expect("launch");
                if let Err(e) = compare("pairwise", dtype, op, &expected, out.bytes(), &inputs) {
                    panic!("{e}");
                }
            }
        }
    }

    #[test]
    fn divide_matches_the_cpu() {
        let divisors = [1usize, 2, 3, 7, 255, 256, 1 << 31, 1 << 63, usize::MAX];
        let mut failures = Vec::new();
        for (d, dtype) in DataType::ALL.into_iter().enumerate() {
            for shape in SHAPES {
                for (k, count) in sizes(dtype, shape).into_iter().enumerate() {
                    for (v, &n) in divisors.iter().enumerate() {
                        let misalign = [0, dtype.size(), 8][(k + v) % 3];
                        let mut rng = Rng((d * 1000 + k * 10 + v) as u64);
                        let mut buf = Buf::new(count * dtype.size(), misalign);
                        for i in 0..count {
                            let bits = random_bits(&mut rng, dtype);
                            write(dtype, buf.bytes_mut(), i, bits);
                        }
                        let mut expected = buf.bytes().to_vec();
                        kernels::divide(dtype, &mut expected, n);
                        // SAFETY: `buf` holds `count` elements.
                        let r = unsafe {
                            divide_with_shape(dtype, buf.bytes_mut().as_mut_ptr(), count, n, shape)
                        };
                        if let Err(e) = r {
                            failures.push(format!("{} / {n}: {e}", dtype.name()));
                            continue;
                        }
                        // One operand: no NaN leeway (compare as a max).
                        let what = format!(
                            "divide by {n}, count {count}, misalign {misalign}, shape {shape:?}"
                        );
                        if let Err(e) =
                            compare(&what, dtype, ReduceOp::Max, &expected, buf.bytes(), &[])
                        {
                            failures.push(e);
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn integer_divide_extremes() {
        // i128 semantics of the CPU: -128 / 128 = -1, -2^63 / 2^63 = -1, and a
        // divisor above the type's range gives 0.
        let cases: [(DataType, u64, usize); 6] = [
            (DataType::Int8, 0x80, 128),
            (DataType::Int8, 0x80, 255),
            (DataType::Uint8, 0xff, 256),
            (DataType::Int64, 1 << 63, 1 << 63),
            (DataType::Int64, 1 << 63, usize::MAX),
            (DataType::Int32, 0x8000_0000, 1 << 31),
        ];
        for (dtype, bits, n) in cases {
            let mut buf = Buf::new(dtype.size(), 0);
            write(dtype, buf.bytes_mut(), 0, bits);
            let mut expected = buf.bytes().to_vec();
            kernels::divide(dtype, &mut expected, n);
            let shape = SHAPES[0];
            // SAFETY: one element.
            unsafe { divide_with_shape(dtype, buf.bytes_mut().as_mut_ptr(), 1, n, shape) }
                .expect("launch");
            assert_eq!(
                buf.bytes(),
                &expected[..],
                "{} {bits:#x} / {n}",
                dtype.name()
            );
        }
    }
}
