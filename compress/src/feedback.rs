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
