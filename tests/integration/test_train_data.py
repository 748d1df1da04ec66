"""The trainer on a user's data: a uint16 token file (nanoGPT's .bin) and an image folder ROOT/<class>/<img>;
and the ResNet model with FLOP-counted MFU inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest


def train(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrig",
            "--json",
            "train",
            "--steps",
            "6",
            "--log-every",
            "3",
            "--workers",
            "1",
            "--no-tensorboard",
            "--device",
            "cpu",
            "--no-ckpt-final",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)["summary"]


def test_token_file(tmp_path):
    tokens = (np.arange(20000) * 7 % 500).astype(np.uint16)  # a periodic, learnable sequence
    tokens.tofile(tmp_path / "tokens.bin")
    s = train(
        "--model",
        "gpt",
        "--size",
        "tiny",
        "--data",
        str(tmp_path / "tokens.bin"),
        "--out",
        str(tmp_path / "r"),
        "--lr",
        "1e-2",
    )
    assert s["steps"] == 6 and s["tokens_per_s"] > 0 and s["final_loss"] < 6.2


def test_token_file_with_ids_beyond_the_vocabulary_is_a_clear_error(tmp_path, cli):
    np.full(1000, 60000, dtype=np.uint16).tofile(tmp_path / "big.bin")
    r = cli(
        "train",
        "--size",
        "tiny",
        "--data",
        str(tmp_path / "big.bin"),
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
    )
    assert r.code == 2 and "token id 60000 >= the model's vocabulary 512" in r.err and r.err.count("\n") == 1


def test_image_folder_with_resnet(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, colour in enumerate(((255, 0, 0), (0, 0, 255))):
        d = tmp_path / "images" / f"class{c}"
        d.mkdir(parents=True)
        for i in range(12):
            arr = np.clip(np.array(colour) + rng.normal(0, 30, (40, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(d / f"{i}.png")
    s = train(
        "--model",
        "resnet",
        "--size",
        "tiny",
        "--data",
        str(tmp_path / "images"),
        "--image-size",
        "32",
        "--micro-batch",
        "4",
        "--out",
        str(tmp_path / "r"),
    )
    assert s["images_per_s"] > 0 and s["params"] > 0
    meta_free = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert meta_free["final_loss"] == pytest.approx(s["final_loss"])


def test_generated_images_learnable(tmp_path):
    s = train(
        "--model", "resnet", "--size", "tiny", "--micro-batch", "16", "--lr", "3e-3", "--out", str(tmp_path)
    )
    assert s["final_loss"] < 2.6  # 10 classes: ln(10) = 2.30 at chance; it must at least be finite and sane
