"""Convergence of DDP training over sncl with compressed gradients.

    scripts/convergence.sh            # sets up the venv, runs this, plots

or by hand, in the torch virtualenv with sncl_torch installed:

    torchrun --standalone --nproc_per_node 2 python/bench/convergence.py --out target/convergence

A small classifier (an MLP, 64 -> 256 -> 256 -> 10, 84k parameters)
learns a random teacher network's labels on synthetic data, data parallel
over the ranks, with SGD and momentum. The same run (same initial weights,
same batches) is repeated with each gradient codec of sncl's compressed
all-reduce as a DDP communication hook, with and without error feedback:
uncompressed (sncl's all_reduce), fp16, int8, top-k 1 %, mxfp8 and mxfp4.
Rank 0 writes every run's training-loss curve and held-out loss to
OUT/convergence.json and prints the table; scripts/convergence.sh plots it.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import sncl_torch

DIM, HIDDEN, CLASSES = 64, 256, 10

# (name, codec, error feedback)
RUNS = [
    ("uncompressed", None, False),
    ("fp16", "fp16", False),
    ("fp16 + EF", "fp16", True),
    ("int8", "int8", False),
    ("int8 + EF", "int8", True),
    ("top-k 1%", "topk:0.01", False),
    ("top-k 1% + EF", "topk:0.01", True),
    ("mxfp8", "mxfp8", False),
    ("mxfp8 + EF", "mxfp8", True),
    ("mxfp4", "mxfp4", False),
    ("mxfp4 + EF", "mxfp4", True),
]


def teacher():
    g = torch.Generator().manual_seed(7)
    w1 = torch.randn(DIM, 128, generator=g) / DIM**0.5
    w2 = torch.randn(128, CLASSES, generator=g) / 128**0.5
    return lambda x: torch.tanh(x @ w1) @ w2


def batch(seed, step, rank, size, label):
    g = torch.Generator().manual_seed(1_000_003 * step + 1009 * seed + rank)
    x = torch.randn(size, DIM, generator=g)
    return x, label(x).argmax(dim=1)


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def uncompressed_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def train(seed, codec, feedback, args, label, eval_set):
    rank = dist.get_rank()
    ddp = DDP(model(seed))
    if codec is None:
        ddp.register_comm_hook(None, uncompressed_hook)
    else:
        ddp.register_comm_hook(None, sncl_torch.compress_hook(codec, error_feedback=feedback))
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    curve = []
    for step in range(args.steps):
        x, y = batch(seed, step, rank, args.batch, label)
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append(loss.item())
    # The curve averaged over ranks (one all-reduce at the end).
    c = torch.tensor(curve, dtype=torch.float64)
    dist.all_reduce(c, op=dist.ReduceOp.AVG)
    with torch.no_grad():
        x, y = eval_set
        held_out = loss_fn(ddp.module(x), y).item()
    return c.tolist(), held_out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="target/convergence")
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seeds", type=int, default=3, help="runs of each codec (initial weights and batches)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("sncl")
    rank, world = dist.get_rank(), dist.get_world_size()
    label = teacher()
    g = torch.Generator().manual_seed(99)
    ex = torch.randn(4096, DIM, generator=g)
    eval_set = (ex, label(ex).argmax(dim=1))
    results = []
    for name, codec, feedback in RUNS:
        t0 = time.time()
        curves, held = [], []
        for seed in range(args.seeds):
            curve, held_out = train(seed, codec, feedback, args, label, eval_set)
            curves.append(curve)
            held.append(held_out)
        mean_curve = [sum(c[i] for c in curves) / len(curves) for i in range(args.steps)]
        results.append({
            "name": name, "codec": codec, "error_feedback": feedback,
            "curve": mean_curve, "held_out_losses": held,
            "held_out_loss": sum(held) / len(held),
            "final_train_loss": sum(mean_curve[-100:]) / len(mean_curve[-100:]),
            "seconds": time.time() - t0,
        })
        if rank == 0:
            r = results[-1]
            print(f"{name:>16}: held-out loss {r['held_out_loss']:.4f} (seeds: "
                  + ", ".join(f"{h:.4f}" for h in held)
                  + f"), last-100 train loss {r['final_train_loss']:.4f} ({r['seconds']:.1f} s)",
                  flush=True)
    if rank == 0:
        base = results[0]["held_out_loss"]
        print(f"\n{'run':>16} {'held-out loss':>14} {'vs uncompressed':>16}   per seed vs uncompressed")
        for r in results:
            r["vs_uncompressed"] = r["held_out_loss"] / base - 1
            per_seed = [h / b - 1 for h, b in zip(r["held_out_losses"], results[0]["held_out_losses"])]
            print(f"{r['name']:>16} {r['held_out_loss']:>14.4f} {r['vs_uncompressed']:>+15.2%}   "
                  + " ".join(f"{x:+.2%}" for x in per_seed))
        os.makedirs(args.out, exist_ok=True)
        meta = {"world": world, "steps": args.steps, "batch_per_rank": args.batch,
                "lr": args.lr, "seeds": args.seeds,
                "model": f"MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}", "runs": results}
        with open(os.path.join(args.out, "convergence.json"), "w") as f:
            json.dump(meta, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
