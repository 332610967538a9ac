//! Host kernels over channels-last images: im2col and its adjoint, pooling and its gradient.
//! Callers have checked the geometry and the slice lengths.

use std::ops::Range;

use crate::backend::{Conv2d, Images, Pool2d, PoolKind, Window};

/// The input pixels along one axis of `len` that window position `o` covers.
fn covered(w: Window, o: usize, len: usize) -> Range<usize> {
    let start = (o * w.stride) as isize - w.pad as isize;
    let end = (start + w.size as isize).clamp(0, len as isize) as usize;
    (start.max(0) as usize)..end
}

/// Offset of pixel `(n, y, x)` in a channels-last batch of `img`'s shape.
fn pixel(img: Images, n: usize, y: usize, x: usize) -> usize {
    ((n * img.height + y) * img.width + x) * img.channels
}

/// Calls `f(column-matrix entry, image element)` for every entry of `conv`'s column matrix
/// that reads an image element (entries in the padding are skipped).
fn for_each_tap(conv: Conv2d, out: (usize, usize), mut f: impl FnMut(usize, usize)) {
    let img = conv.input;
    let Window { size, stride, pad } = conv.window;
    let patch = conv.patch();
    let mut row = 0;
    for n in 0..img.batch {
        for oy in 0..out.0 {
            for ox in 0..out.1 {
                for dy in 0..size {
                    let Some(y) = (oy * stride + dy).checked_sub(pad).filter(|&y| y < img.height) else {
                        continue;
                    };
                    for dx in 0..size {
                        let Some(x) = (ox * stride + dx).checked_sub(pad).filter(|&x| x < img.width) else {
                            continue;
                        };
                        let at = pixel(img, n, y, x);
                        for c in 0..img.channels {
                            f(row * patch + (c * size + dy) * size + dx, at + c);
                        }
                    }
                }
                row += 1;
            }
        }
    }
}

/// See [`crate::Backend::im2col`].
pub(super) fn im2col(conv: Conv2d, out: (usize, usize), x: &[f32], col: &mut [f32]) {
    col.fill(0.0);
    for_each_tap(conv, out, |c, i| col[c] = x[i]);
}

/// See [`crate::Backend::col2im`].
pub(super) fn col2im(conv: Conv2d, out: (usize, usize), col: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    for_each_tap(conv, out, |c, i| dx[i] += col[c]);
}

/// Calls `f(output element, input pixel offsets of the window)` for every output element of
/// `pool`; the offsets point at channel 0 of each covered pixel, in row-major window order.
fn for_each_window(pool: Pool2d, out: Images, mut f: impl FnMut(usize, usize, &[usize])) {
    let img = pool.input;
    let mut cells = Vec::with_capacity(pool.window.size * pool.window.size);
    for n in 0..img.batch {
        for oy in 0..out.height {
            let ys = covered(pool.window, oy, img.height);
            for ox in 0..out.width {
                let xs = covered(pool.window, ox, img.width);
                cells.clear();
                for y in ys.clone() {
                    cells.extend(xs.clone().map(|x| pixel(img, n, y, x)));
                }
                let at = pixel(out, n, oy, ox);
                for c in 0..img.channels {
                    f(at + c, c, &cells);
                }
            }
        }
    }
}

/// The first largest element of a window: its offset.
fn argmax(x: &[f32], channel: usize, cells: &[usize]) -> usize {
    let mut best = cells[0] + channel;
    for &cell in &cells[1..] {
        if x[cell + channel] > x[best] {
            best = cell + channel;
        }
    }
    best
}

/// See [`crate::Backend::pool`].
pub(super) fn pool(pool: Pool2d, out: Images, x: &[f32], y: &mut [f32]) {
    for_each_window(pool, out, |o, c, cells| {
        y[o] = match pool.kind {
            PoolKind::Max => x[argmax(x, c, cells)],
            PoolKind::Avg => cells.iter().map(|&i| x[i + c]).sum::<f32>() / cells.len() as f32,
        };
    });
}

/// See [`crate::Backend::pool_backward`].
pub(super) fn pool_backward(pool: Pool2d, out: Images, x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.fill(0.0);
    for_each_window(pool, out, |o, c, cells| match pool.kind {
        PoolKind::Max => dx[argmax(x, c, cells)] += dy[o],
        PoolKind::Avg => {
            let share = dy[o] / cells.len() as f32;
            for &i in cells {
                dx[i + c] += share;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Backend, CpuBackend};

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * seed).sin()).collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum()
    }

    fn conv(
        batch: usize,
        channels: usize,
        h: usize,
        w: usize,
        size: usize,
        stride: usize,
        pad: usize,
    ) -> Conv2d {
        Conv2d {
            input: Images { batch, channels, height: h, width: w },
            window: Window { size, stride, pad },
        }
    }

    /// `y[n, oy, ox, o] = Σ_{c, dy, dx} w[o, c, dy, dx] · x[n, oy·s + dy − p, ox·s + dx − p, c]`.
    fn direct_conv(c: Conv2d, outs: usize, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (oh, ow) = c.output_size().unwrap();
        let Images { batch, channels, height, width } = c.input;
        let Window { size, stride, pad } = c.window;
        let mut y = vec![0.0; batch * oh * ow * outs];
        for n in 0..batch {
            for oy in 0..oh {
                for ox in 0..ow {
                    for o in 0..outs {
                        let mut s = 0.0;
                        for ch in 0..channels {
                            for dy in 0..size {
                                for dx in 0..size {
                                    let (iy, ix) = (
                                        (oy * stride + dy) as isize - pad as isize,
                                        (ox * stride + dx) as isize - pad as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= height as isize || ix >= width as isize {
                                        continue;
                                    }
                                    let xi =
                                        ((n * height + iy as usize) * width + ix as usize) * channels + ch;
                                    s += w[((o * channels + ch) * size + dy) * size + dx] * x[xi];
                                }
                            }
                        }
                        y[((n * oh + oy) * ow + ox) * outs + o] = s;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn im2col_times_weights_is_the_direct_convolution() {
        for c in [conv(2, 3, 6, 5, 3, 1, 1), conv(1, 2, 7, 7, 5, 2, 2), conv(3, 1, 4, 4, 2, 2, 0)] {
            let outs = 4;
            let x = values(c.input.len(), 0.7);
            let w = values(outs * c.patch(), 0.3);
            let mut col = Arc::new(vec![f32::NAN; c.rows().unwrap() * c.patch()]);
            CpuBackend.im2col(c, &Arc::new(x.clone()), &mut col).unwrap();
            let g = crate::Gemm {
                m: c.rows().unwrap(),
                n: outs,
                k: c.patch(),
                a_t: false,
                b_t: true,
                alpha: 1.0,
                beta: 0.0,
            };
            let mut y = Arc::new(vec![0.0; c.rows().unwrap() * outs]);
            CpuBackend.gemm(g, (&col, 0), (&Arc::new(w.clone()), 0), (&mut y, 0)).unwrap();
            let want = direct_conv(c, outs, &x, &w);
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{c:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        for c in [conv(2, 3, 6, 5, 3, 1, 1), conv(1, 2, 7, 7, 5, 2, 2)] {
            let x = values(c.input.len(), 0.9);
            let r = values(c.rows().unwrap() * c.patch(), 0.4);
            let (mut col, mut back) = (Arc::new(vec![0.0; r.len()]), Arc::new(vec![f32::NAN; x.len()]));
            CpuBackend.im2col(c, &Arc::new(x.clone()), &mut col).unwrap();
            CpuBackend.col2im(c, &Arc::new(r.clone()), &mut back).unwrap();
            let (lhs, rhs) = (dot(&col, &r), dot(&x, &back));
            assert!((lhs - rhs).abs() < 1e-4 * lhs.abs().max(1.0), "{lhs} vs {rhs}");
        }
    }

    fn pool2(kind: PoolKind, size: usize, stride: usize, pad: usize) -> Pool2d {
        Pool2d {
            input: Images { batch: 1, channels: 2, height: 3, width: 3 },
            window: Window { size, stride, pad },
            kind,
        }
    }

    #[test]
    fn pooling_keeps_the_maximum_or_the_mean_of_the_pixels_inside() {
        // Channel 0 holds 0..9 row-major, channel 1 holds its negation.
        let x: Vec<f32> = (0..9).flat_map(|i| [i as f32, -(i as f32)]).collect();
        let x = Arc::new(x);
        let mut y = Arc::new(vec![0.0; 8]);
        CpuBackend.pool(pool2(PoolKind::Max, 2, 1, 0), &x, &mut y).unwrap();
        assert_eq!(*y, vec![4.0, 0.0, 5.0, -1.0, 7.0, -3.0, 8.0, -4.0]);
        // 3×3 windows with stride 2 and padding 1: 2×2 outputs whose windows hold 4 pixels.
        CpuBackend.pool(pool2(PoolKind::Avg, 3, 2, 1), &x, &mut y).unwrap();
        assert_eq!(*y, vec![2.0, -2.0, 3.0, -3.0, 5.0, -5.0, 6.0, -6.0]);
        assert!(pool2(PoolKind::Avg, 2, 1, 2).output().is_err(), "padding as large as the window");
    }

    #[test]
    fn pool_gradients_route_to_the_maximum_and_spread_the_mean() {
        let x = Arc::new(vec![
            1.0, 0.0, 3.0, 0.0, 3.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 1.0,
        ]);
        let dy = Arc::new(vec![10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]);
        let mut dx = Arc::new(vec![f32::NAN; 18]);
        CpuBackend.pool_backward(pool2(PoolKind::Max, 2, 1, 0), &x, &dy, &mut dx).unwrap();
        // Channel 0 (pixels 1 3 3 / 2 0 0 / 0 0 9): the window at (0, 1) holds 3 twice and
        // routes to the first. Channel 1 is 0 but for pixel 8: ties go to each window's first.
        let want =
            [0.0, 20.0, 40.0, 40.0, 0.0, 0.0, 50.0, 60.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 70.0, 80.0];
        assert_eq!(*dx, want);
        CpuBackend.pool_backward(pool2(PoolKind::Avg, 3, 2, 1), &x, &dy, &mut dx).unwrap();
        let center = (10.0 + 30.0 + 50.0 + 70.0) / 4.0;
        assert_eq!(dx[8], center, "the center pixel is in all four windows");
        assert_eq!(dx[0], 10.0 / 4.0, "a corner is in one window");
    }
}
