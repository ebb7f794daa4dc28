"""Write a token file for the GPT-2 example: this project's own text (Python, Markdown, TOML),
tokenized by bytes (token id = byte value, vocabulary 256) as a flat uint16 array: the format
nanoGPT-style pipelines write. No download.

    python examples/gpt2/make_tokens.py [OUT] [--min-tokens N]
"""

from __future__ import annotations

import argparse
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sources() -> list[Path]:
    """The checkout's text files when this file sits in one; after `pswift init --example gpt2`
    (a copy elsewhere), the installed pswift's own sources."""
    if (ROOT / "pipeswift_slurm").is_dir() and (ROOT / "pyproject.toml").is_file():
        return [p for ext in ("py", "md", "toml") for p in ROOT.glob(f"*/**/*.{ext}")
                if ".venv" not in p.parts and "pswift-runs" not in p.parts]
    import pipeswift_launch
    import pipeswift_slurm
    return [p for pkg in (pipeswift_slurm, pipeswift_launch) for p in Path(pkg.__file__).parent.rglob("*.py")]


def corpus(min_tokens: int) -> bytes:
    """The project's text files in a fixed order, repeated until ``min_tokens`` bytes."""
    files = sorted(sources())
    text = b"\n".join(p.read_bytes() for p in files)
    return text * max(1, -(-min_tokens // max(1, len(text))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=str(Path(__file__).with_name("tokens.bin")))
    ap.add_argument("--min-tokens", type=int, default=1_000_000)
    args = ap.parse_args()
    tokens = array("H", iter(corpus(args.min_tokens)))  # uint16, little-endian on every platform pswift runs on
    Path(args.out).write_bytes(tokens.tobytes())
    print(f"wrote {len(tokens)} tokens to {args.out}")


if __name__ == "__main__":
    main()
