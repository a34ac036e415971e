"""Draws a zero run's TensorBoard scalars as an SVG, reading the event files with TensorBoard's
own EventAccumulator (what the TensorBoard UI reads): the README's view of one run.

  python3 bench/tensorboard_view.py LOGDIR OUT.svg [TAG ...]
  default tags: Train/Samples/train_loss, lr, tokens_per_s, utilisation
"""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

W, H, PAD = 360, 200, 42


def panel(x0, y0, tag, points):
    xs = [p.step for p in points]
    ys = [p.value for p in points]
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1
    sx = lambda x: x0 + PAD + (x - xs[0]) / max(1, xs[-1] - xs[0]) * (W - PAD - 10)
    sy = lambda y: y0 + H - PAD + 10 - (y - lo) / (hi - lo) * (H - PAD - 20)
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(zip(xs, ys)))
    name = tag.split("/")[-1]
    return (f'<rect x="{x0 + PAD}" y="{y0 + 10}" width="{W - PAD - 10}" height="{H - PAD - 20}" '
            f'fill="#fafafa" stroke="#ccc"/>'
            f'<text x="{x0 + W / 2}" y="{y0 + 8}" font-size="11" text-anchor="middle">{tag}</text>'
            f'<path d="{path}" fill="none" stroke="#e8710a" stroke-width="1.5"/>'
            f'<text x="{x0 + PAD - 3}" y="{y0 + 18}" font-size="9" text-anchor="end">{hi:.4g}</text>'
            f'<text x="{x0 + PAD - 3}" y="{y0 + H - PAD + 10}" font-size="9" text-anchor="end">{lo:.4g}</text>'
            f'<text x="{x0 + PAD}" y="{y0 + H - PAD + 22}" font-size="9">{xs[0]}</text>'
            f'<text x="{x0 + W - 10}" y="{y0 + H - PAD + 22}" font-size="9" text-anchor="end">{xs[-1]} samples</text>'
            f'<title>{name}: {len(ys)} points</title>')


def main(logdir, out, *tags):
    tags = tags or ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/tokens_per_s",
                    "Train/Samples/utilisation"]
    acc = EventAccumulator(logdir)
    acc.Reload()
    have = [t for t in tags if t in acc.Tags()["scalars"]]
    cols = 2
    rows = (len(have) + cols - 1) // cols
    parts = [panel((i % cols) * W, (i // cols) * H, t, acc.Scalars(t)) for i, t in enumerate(have)]
    with open(out, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * W}" height="{rows * H}" '
                f'font-family="sans-serif">' + "".join(parts) + "</svg>\n")
    print(f"{out}: {', '.join(have)} from {logdir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
