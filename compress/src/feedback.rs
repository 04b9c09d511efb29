//! Error feedback: the residual of lossy compression carried to the next step.

use crate::Codec;

/// Error-feedback state of one tensor: the residual `compensated - decoded`
/// of the last compression, added to the next step's gradient so that over
/// many steps the sum of what was sent plus the residual equals the sum of
/// the gradients (up to f32 rounding).
///
/// ```
/// use compress::{Codec, ErrorFeedback};
/// let codec = Codec::parse("topk:0.25").unwrap();
/// let mut ef = ErrorFeedback::new(8);
/// let mut grad = vec![1.0f32, -2.0, 3.0, -4.0, 0.5, 0.25, 0.0, 0.125];
/// let mut wire = Vec::new();
/// ef.encode_with_feedback(&codec, &mut grad, &mut wire);
/// let mut sent = vec![0.0f32; 8];
/// codec.decode(&wire, 8, &mut sent).unwrap();
/// // What was not sent is kept for the next step.
/// for i in 0..8 {
///     assert_eq!(sent[i] + ef.residual()[i], grad[i]);
/// }
/// ```
///
/// A NaN or infinite gradient poisons the residual (as it should poison the
/// step); call [`ErrorFeedback::reset`] after skipping such a step.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    /// A zero residual for a tensor of `n` elements.
    pub fn new(n: usize) -> Self {
        ErrorFeedback {
            residual: vec![0.0; n],
        }
    }

    /// Number of elements of the tensor.
    pub fn len(&self) -> usize {
        self.residual.len()
    }

    /// True for a tensor of zero elements.
    pub fn is_empty(&self) -> bool {
        self.residual.is_empty()
    }

    /// Sets the residual to zero.
    pub fn reset(&mut self) {
        self.residual.fill(0.0);
    }

    /// `grad += residual`.
    ///
    /// # Panics
    /// If `grad.len()` differs from the tensor's length.
    pub fn compensate(&mut self, grad: &mut [f32]) {
        self.check(grad.len());
        for (g, r) in grad.iter_mut().zip(&self.residual) {
            *g += *r;
        }
    }

    /// `residual = compensated - decoded`.
    ///
    /// # Panics
    /// If either slice's length differs from the tensor's length.
    pub fn update(&mut self, compensated: &[f32], decoded: &[f32]) {
        self.check(compensated.len());
        self.check(decoded.len());
        for ((r, c), d) in self.residual.iter_mut().zip(compensated).zip(decoded) {
            *r = *c - *d;
        }
    }

    /// `residual[offset..offset + n] = compensated - decoded` for slices of
    /// `n` elements: [`ErrorFeedback::update`] of a part of the tensor (a
    /// pipelined exchange encodes it piece by piece).
    ///
    /// # Panics
    /// If the slices' lengths differ or the range lies outside the tensor.
    pub fn update_range(&mut self, offset: usize, compensated: &[f32], decoded: &[f32]) {
        assert_eq!(
            compensated.len(),
            decoded.len(),
            "error feedback: compensated and decoded slices differ in length"
        );
        let end = offset
            .checked_add(compensated.len())
            .filter(|&e| e <= self.residual.len())
            .unwrap_or_else(|| {
                panic!(
                    "error feedback: range {offset}..+{} outside a tensor of {} elements",
                    compensated.len(),
                    self.residual.len()
                )
            });
        for ((r, c), d) in self.residual[offset..end]
            .iter_mut()
            .zip(compensated)
            .zip(decoded)
        {
            *r = *c - *d;
        }
    }

    /// One step: adds the residual to `grad` (which is left compensated),
    /// encodes it into `out`, decodes that locally (exactly what a receiver
    /// decodes) and keeps `compensated - decoded` as the new residual.
    ///
    /// # Panics
    /// If `grad.len()` differs from the tensor's length, or as
    /// [`Codec::encode`] does.
    pub fn encode_with_feedback(&mut self, codec: &Codec, grad: &mut [f32], out: &mut Vec<u8>) {
        self.compensate(grad);
        codec.encode(grad, out);
        let n = grad.len();
        // The residual buffer doubles as the decode target.
        codec
            .decode(out, n, &mut self.residual)
            .expect("a codec decodes its own encoding");
        for (r, g) in self.residual.iter_mut().zip(grad.iter()) {
            *r = *g - *r;
        }
    }

    /// The current residual.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    fn check(&self, n: usize) {
        assert_eq!(
            n,
            self.residual.len(),
            "error feedback: slice length differs from the tensor's"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorFeedback;

    #[test]
    fn update_range_sets_that_range_as_update_does_the_whole() {
        let comp = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let dec = [0.5f32, 2.0, 2.5, 4.25, 6.0];
        let mut whole = ErrorFeedback::new(5);
        whole.update(&comp, &dec);
        let mut parts = ErrorFeedback::new(5);
        parts.update_range(0, &comp[..2], &dec[..2]);
        parts.update_range(2, &comp[2..], &dec[2..]);
        assert_eq!(parts, whole);
        // A range touches only its own elements.
        let mut one = ErrorFeedback::new(5);
        one.update_range(3, &comp[3..4], &dec[3..4]);
        assert_eq!(one.residual(), &[0.0, 0.0, 0.0, -0.25, 0.0]);
    }

    #[test]
    #[should_panic(expected = "outside a tensor of 5 elements")]
    fn update_range_outside_the_tensor_panics_with_the_range() {
        ErrorFeedback::new(5).update_range(4, &[1.0, 2.0], &[1.0, 2.0]);
    }
}
