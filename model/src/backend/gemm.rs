//! Matrix products of the CPU kernels on host slices, by the `gemm` crate (flex's own
//! matmul), with transposed operands read in place through their strides.

/// How element `(i, j)` of an operand sits in its slice: `i · row + j · col`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    row: usize,
    col: usize,
}

impl Layout {
    /// A row-major matrix with `cols` columns.
    pub(crate) fn rows(cols: usize) -> Self {
        Self { row: cols, col: 1 }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub(crate) fn transposed(cols: usize) -> Self {
        Self { row: 1, col: cols }
    }

    /// One past the last offset of an `r × c` view.
    fn extent(self, r: usize, c: usize) -> usize {
        if r == 0 || c == 0 {
            0
        } else {
            (r - 1) * self.row + (c - 1) * self.col + 1
        }
    }
}

/// Products at least this large (`m·n·k`) run on the rayon pool (flex's threshold).
const PARALLEL_WORK: usize = 192 * 192 * 192;

/// `out = lhs · rhs` (or `out += lhs · rhs` when `accumulate`) for an `m × k` `lhs`, a
/// `k × n` `rhs` and a row-major `m × n` `out`.
///
/// # Panics
///
/// If an operand's slice is too short for its view.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    (m, n, k): (usize, usize, usize),
    out: &mut [f32],
    lhs: (&[f32], Layout),
    rhs: (&[f32], Layout),
    accumulate: bool,
) {
    let ((a, la), (b, lb)) = (lhs, rhs);
    assert!(out.len() >= m * n, "matmul output too short");
    assert!(a.len() >= la.extent(m, k), "matmul lhs too short");
    assert!(b.len() >= lb.extent(k, n), "matmul rhs too short");
    let parallelism = if m * n * k >= PARALLEL_WORK {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above keep every element gemm reads or writes inside its slice;
    // `out` is borrowed mutably, so nothing else aliases it.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            la.col as isize,
            la.row as isize,
            b.as_ptr(),
            lb.col as isize,
            lb.row as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}
