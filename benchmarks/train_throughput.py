"""Training images/s of the embedding model on the device present (a measurement, not a test).

    python -m benchmarks.train_throughput [--params params.yaml] [--steps 20] [--warmup 3]
                                          [--device auto] [--skip-resnet18]

Two configurations, each timed over ``--steps`` full training steps after ``--warmup`` untimed ones
(batched augmentation, forward, classification loss, backward, SGD step; bf16 autocast and
channels_last on GPU), with the uint8 images already on the device:

* the default architecture of params.yaml (``architectures.default``) on 28×28 one-channel images
  at ``training.batch_size``, alone and with a frozen old model of the same architecture embedding the
  batch (what a BCT new generation costs);
* ResNet-18 with the CIFAR stem on 32×32 three-channel images, batch 512 (issue target on one H100:
  at least 25,000 images/s).

It also prints the FLOPs of one forward pass, and the time a default CPU training of the
pipeline's size would take at the measured rate. The machine may be shared: say so when you quote a figure.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from modelupgrade.config import load_params
from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.models import EmbeddingModel, autocast_for
from modelupgrade.runtime import describe_device, select_device
from modelupgrade.training import BatchAugment


def forward_flops(model: EmbeddingModel, channels: int, size: int) -> float:
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, channels, size, size, dtype=torch.uint8))
    model.train()
    return float(counter.get_total_flops())


def images_per_second(
    architecture: ArchitectureParams, training: TrainingParams, channels: int, size: int, batch_size: int,
    device: torch.device, steps: int, warmup: int, with_old_model: bool,
) -> float:
    num_classes = 100
    model = EmbeddingModel(architecture, channels, num_classes, size).to(device)
    old = EmbeddingModel(architecture, channels, num_classes, size).to(device).eval().requires_grad_(False) if with_old_model else None
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
        if old is not None:
            old.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    augment = BatchAugment(tuple(training.crop_scale), tuple(training.crop_ratio), training.hflip)
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch_size * 4, channels, size, size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, num_classes, (batch_size * 4,), device=device)

    def step(i: int) -> None:
        rows = slice((i % 4) * batch_size, (i % 4 + 1) * batch_size)
        view = augment(images[rows], generator)
        with autocast_for(device):
            features = model(view)
            loss = model.classifier.loss(features, labels[rows])
            if old is not None:
                with torch.no_grad():
                    old_features = old(view)
                loss = loss + old.classifier.loss(features, labels[rows])
                loss = loss + 0.0 * old_features.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for i in range(warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for i in range(steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * batch_size / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--skip-resnet18", action="store_true")
    parser.add_argument("--pipeline-images", type=int, default=None,
                        help="images per epoch of a default training (default: 10 × dataset.max_train_per_class)")
    args = parser.parse_args(argv)

    params = load_params(args.params)
    device = select_device(args.device)
    print(f"device: {describe_device(device)}; torch threads {torch.get_num_threads()}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; load average {os.getloadavg()[0]:.1f}")
    default = params.architectures["default"]
    training = params.training
    flops = forward_flops(EmbeddingModel(default, 1, 10, 28), 1, 28)
    rate = images_per_second(default, training, 1, 28, training.batch_size, device, args.steps, args.warmup, False)
    rate_bct = images_per_second(default, training, 1, 28, training.batch_size, device, args.steps, args.warmup, True)
    print(f"default ({default.backbone}, cifar_stem={default.cifar_stem}, {default.backbone_kwargs}) 28×28×1, "
          f"batch {training.batch_size}: {flops / 1e6:.1f} MFLOP/forward; "
          f"{rate:,.0f} images/s alone, {rate_bct:,.0f} images/s with a frozen old model (BCT)")
    per_class = params.dataset.max_train_per_class
    images = args.pipeline_images or (10 * per_class if per_class else None)
    if images:
        seconds = training.epochs * images / rate_bct
        print(f"  → a new generation on {images} images × {training.epochs} epochs ≈ {seconds:.1f} s of training steps")
    if not args.skip_resnet18:
        resnet18 = ArchitectureParams(backbone="resnet18", cifar_stem=True, embedding_dim=default.embedding_dim)
        steps = args.steps if device.type == "cuda" else max(2, args.steps // 10)
        rate18 = images_per_second(resnet18, training, 3, 32, 512, device, steps, min(args.warmup, 1) if device.type == "cpu" else args.warmup, False)
        print(f"resnet18 (CIFAR stem) 32×32×3, batch 512{', bf16' if device.type == 'cuda' else ''}: {rate18:,.0f} images/s")


if __name__ == "__main__":
    main()
