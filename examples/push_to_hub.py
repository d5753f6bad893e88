# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Publish a trained drafter: weights + config (z-lab layout) + remote code + model card, in one call.

    hf auth login                       # once; or set HF_TOKEN
    python examples/push_to_hub.py --drafter runs/my-drafter --repo me/my-drafter

Anyone can then load it, with or without hf_dflash installed:

    import hf_dflash; drafter = hf_dflash.DFlashDraftModel.from_pretrained("me/my-drafter")
    from transformers import AutoModel; drafter = AutoModel.from_pretrained("me/my-drafter", trust_remote_code=True)

and serve it with vLLM / SGLang (see examples/serve.sh).
"""

import argparse
import json
from pathlib import Path

from hf_dflash import DFlashDraftModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", required=True, help="Folder written by `hf-dflash train` or save_pretrained.")
    parser.add_argument("--repo", required=True, help="Hub repository id, e.g. me/my-drafter.")
    parser.add_argument("--private", action="store_true")
    args = parser.parse_args()

    drafter = DFlashDraftModel.from_pretrained(args.drafter)
    info_file = Path(args.drafter) / "training_info.json"
    if info_file.exists():  # target, data and measured tau go into the model card
        drafter.training_info = json.loads(info_file.read_text())
    commit = drafter.push_to_hub(args.repo, private=args.private)
    print(f"uploaded {args.drafter} to https://huggingface.co/{args.repo} ({commit})")


if __name__ == "__main__":
    main()
