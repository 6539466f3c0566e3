"""Training images/s of the embedding model on the device present (a measurement, not a test).

    python -m benchmarks.train_throughput [--params params.yaml] [--steps 20] [--device auto]
                                          [--skip-resnet18] [--compile]

Each figure is the training engine itself (``Trainer.fit``: batched augmentation, forward, the
strategy's losses, backward, SGD step; bf16 autocast, channels_last and cuDNN autotuning on GPU) on
random uint8 images already in memory: two epochs of ``--steps`` steps, and the rate of the second
(the first carries the warm-up, cuDNN's algorithm search and, with ``--compile``, the compile).

* the default architecture of params.yaml (``architectures.default``) on 28×28 one-channel images
  at ``training.batch_size``, alone and as a BCT new generation (a frozen old model
  embeds each batch);
* ResNet-18 with the CIFAR stem on 32×32 three-channel images, batch 512 (issue target on one H100:
  at least 25,000 images/s), eager and, with ``--compile`` on a GPU, under torch.compile.

It also prints the FLOPs of one forward pass, and the time a default CPU training of the
pipeline's size would take at the measured rate. The machine may be shared: say so when
you quote a figure.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.utils.flop_counter import FlopCounterMode

from modelupgrade.config.training import ArchitectureParams, TrainingParams
from modelupgrade.models import EmbeddingModel
from modelupgrade.params import load_params
from modelupgrade.runtime import describe_device, select_device
from modelupgrade.strategies import build_strategy
from modelupgrade.training import Trainer


def forward_flops(model: EmbeddingModel, channels: int, size: int) -> float:
    model.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, channels, size, size, dtype=torch.uint8))
    model.train()
    return float(counter.get_total_flops())


def images_per_second(
    architecture: ArchitectureParams,
    training: TrainingParams,
    channels: int,
    size: int,
    batch_size: int,
    device: torch.device,
    steps: int,
    with_old_model: bool,
    compile_model: bool = False,
) -> float:
    """The second epoch's images/s of ``Trainer.fit`` on ``steps`` random batches."""
    num_classes = 100
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(
        0, 256, (batch_size * steps, channels, size, size), dtype=torch.uint8, generator=generator
    )
    labels = torch.arange(batch_size * steps) % num_classes
    model = EmbeddingModel(architecture, channels, num_classes, size)
    strategy = build_strategy("bct" if with_old_model else "independent")
    old = EmbeddingModel(architecture, channels, num_classes, size) if with_old_model else None
    settings = training.model_copy(
        update={
            "epochs": 2,
            "batch_size": batch_size,
            "warmup_epochs": 0.0,
            "compile": compile_model,
        }
    )
    result = Trainer(settings, device=device, seed=0, progress=False).fit(
        model, images, labels, strategy, old
    )
    return float(result.history[-1]["images_per_second"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        help="training steps per epoch (two epochs; the second is timed)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--skip-resnet18", action="store_true")
    parser.add_argument(
        "--compile", action="store_true", help="on a GPU, also time ResNet-18 under torch.compile"
    )
    parser.add_argument(
        "--pipeline-images",
        type=int,
        default=None,
        help="images per epoch of a default training (default: 10 × dataset.max_train_per_class)",
    )
    args = parser.parse_args(argv)

    params = load_params(args.params)
    device = select_device(args.device)
    print(
        f"device: {describe_device(device)}; torch threads {torch.get_num_threads()}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    default = params.architectures["default"]
    training = params.training
    flops = forward_flops(EmbeddingModel(default, 1, 10, 28), 1, 28)
    rate = images_per_second(
        default, training, 1, 28, training.batch_size, device, args.steps, False
    )
    rate_bct = images_per_second(
        default, training, 1, 28, training.batch_size, device, args.steps, True
    )
    print(
        f"default ({default.backbone}, cifar_stem={default.cifar_stem}, {default.backbone_kwargs}) "
        f"28×28×1, batch {training.batch_size}: {flops / 1e6:.1f} MFLOP/forward; {rate:,.0f} "
        f"images/s alone, {rate_bct:,.0f} images/s with a frozen old model (BCT)"
    )
    per_class = params.dataset.max_train_per_class
    images = args.pipeline_images or (10 * per_class if per_class else None)
    if images:
        seconds = training.epochs * images / rate_bct
        print(
            f"  → a new generation on {images} images × {training.epochs} epochs ≈ "
            f"{seconds:.1f} s of training steps"
        )
    if not args.skip_resnet18:
        resnet18 = ArchitectureParams(
            backbone="resnet18", cifar_stem=True, embedding_dim=default.embedding_dim
        )
        flops18 = forward_flops(EmbeddingModel(resnet18, 3, 100, 32), 3, 32)
        steps = args.steps if device.type == "cuda" else max(2, args.steps // 10)
        precision = "bf16" if device.type == "cuda" else "fp32"
        variants = [False, True] if args.compile and device.type == "cuda" else [False]
        for compiled in variants:
            rate18 = images_per_second(
                resnet18, training, 3, 32, 512, device, steps, False, compiled
            )
            print(
                "resnet18 (CIFAR stem) 32×32×3, batch 512, "
                f"{precision}{', torch.compile' if compiled else ', eager'}: {rate18:,.0f} "
                f"images/s ({3 * flops18 * rate18 / 1e12:.1f} TFLOP/s at 3× the forward FLOPs)"
            )


if __name__ == "__main__":
    main()
