"""The command line of ``xbench-sample``, checked before any model loads: each number in its
range as it is parsed (a bad one is one ``error:`` line naming the argument, exit 2), the
device usable on this machine, the output PNG writable."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch


class SampleError(Exception):
    """A one-line problem with the command's input (printed as ``error: ...``, exit 2)."""


class Parser(argparse.ArgumentParser):
    """Raises :class:`SampleError` where argparse would print its usage and exit."""

    def error(self, message: str):
        raise SampleError(f"{message} (xbench-sample --help lists the arguments)")


def number(kind: type, low: float, high: float = math.inf, *, above: bool = False,
           note: str = ""):
    """An argparse type: a finite ``kind`` in ``[low, high]`` (``above``: ``(low, high]``)."""
    noun = "an integer" if kind is int else "a number"
    bounds = f"in ({low}, {high}]" if above else f">= {low}" if high == math.inf \
        else f"in [{low}, {high}]"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not math.isfinite(value) or not (low < value if above else low <= value) \
                or value > high:
            raise argparse.ArgumentTypeError(f"{text} must be {noun} {bounds}{note}")
        return value
    return parse


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    """The arguments, each in range, and the combinations that cannot work refused."""
    parser = Parser(prog="xbench-sample", description=description)
    parser.add_argument("path", type=Path,
                        help="a run record (.json), a checkpoint (.ckpt) or a run's final.pt")
    parser.add_argument("--prompt", default="The ", help="text to continue (default 'The ')")
    parser.add_argument("--length", type=number(int, 0), default=200, help="bytes to generate")
    parser.add_argument("--temperature", type=number(float, 0, note=" (0: greedy)"),
                        default=1.0, help="0: greedy")
    parser.add_argument("--top-k", type=number(int, 1), default=None)
    parser.add_argument("--top-p", type=number(float, 0, 1, above=True), default=None)
    parser.add_argument("--seed", type=number(int, 0, 2 ** 63 - 1), default=0)
    parser.add_argument("--no-cache", action="store_true", help="recompute the window each step")
    parser.add_argument("--benchmark", action="store_true",
                        help="print decode tokens/s with and without the cache")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, ...")
    parser.add_argument("--grid", type=number(int, 1), default=4,
                        help="pixel LM: draw GRID x GRID images (default 4)")
    parser.add_argument("--out", type=Path, default=Path("samples.png"),
                        help="pixel LM: the PNG to write (default samples.png)")
    args = parser.parse_args(argv)
    if not args.prompt.encode("utf-8"):
        raise SampleError("--prompt is empty: give at least one byte to continue")
    if args.benchmark and args.length == 0:
        raise SampleError("--benchmark times --length tokens: give --length 1 or more")
    return args


def usable_device(name: str) -> torch.device:
    """``name`` as a device this machine has (a tensor can be made on it)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as error:
        raise SampleError(f"--device {name} is not a device ({first_line(error)}): give "
                          "cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (device.index or 0) >= count:
            have = f"CUDA devices cuda:0..cuda:{count - 1}; give one of those or" if count \
                else "no CUDA device; give"
            raise SampleError(f"--device {name}: this machine has {have} --device cpu")
    try:
        torch.empty(0, device=device)
    except Exception as error:  # noqa: BLE001 -- any reason the device does not work
        raise SampleError(f"--device {name} is not usable here ({first_line(error)}); "
                          "give --device cpu") from None
    return device


def writable_png(path: Path) -> Path:
    """``path`` if a PNG can be written there: named ``.png``, not a folder, and its nearest
    existing ancestor a folder this process may write in."""
    if path.is_dir():
        raise SampleError(f"--out {path} is a folder: name a .png file in it")
    if path.suffix.lower() != ".png":
        raise SampleError(f"--out {path}: name a .png file (the samples are written as PNG)")
    existing = next(p for p in (path.parent, *path.parent.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise SampleError(f"--out {path}: {existing} is a file, not a folder; choose another "
                          "--out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SampleError(f"--out {path}: cannot write in {existing}; choose another --out")
    return path


def first_line(error: BaseException) -> str:
    """``Type: message``, its first sentence, at most 120 characters."""
    return f"{type(error).__name__}: {error}".splitlines()[0].split(". ")[0][:120]
