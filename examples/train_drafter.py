# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Train a DFlash drafter end to end: regenerate responses with the target, train, measure tau with generate().

CPU toy run (a tiny random Qwen3 target made on the spot, on one CPU thread: about 12 s; tau goes from 1.0 to about
3; tests/test_examples.py runs it):

    python examples/train_drafter.py

A real (small) target on CPU, e.g. the offline SmolLM2-135M-Instruct and your own prompts:

    python examples/train_drafter.py --target smollm2 --prompts prompts.jsonl --num-prompts 2000 \\
        --max-new-tokens 256 --num-layers 2 --epochs 3

The same pipeline from the command line, on N GPUs (accelerate runs one DDP process per GPU):

    hf-dflash regenerate --target Qwen/Qwen3-8B --prompts prompts.jsonl --output train.jsonl \\
        --max-new-tokens 2048 --batch-size 64
    accelerate launch --multi_gpu --num_processes 8 -m hf_dflash train \\
        --target Qwen/Qwen3-8B --data train.jsonl --output qwen3-8b-dflash-b16 \\
        --num-layers 5 --block-size 16 --epochs 6 --lr 6e-4 --max-length 3072 --batch-size 1 --grad-accum 4
    # killed? run the same command with --resume: it continues from the last checkpoint, step for step.
"""

import argparse
import json
from pathlib import Path

import torch

from hf_dflash import DFlashDraftModel
from hf_dflash.data import RegenerationArguments, regenerate
from hf_dflash.evaluation.acceptance import measure_acceptance_length
from hf_dflash.models import load_target
from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments


TOY_WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "storm", "maple", "orbit", "candle"]


def toy_target(folder: Path) -> Path:
    """A 4-layer random Qwen3 (hidden 64) with a character-level tokenizer and a chat template, saved to `folder`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + list("abcdefghijklmnopqrstuvwxyz0123456789 .,?!'\n:"))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<|im_end|>")
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         eos_token_id=3, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():  # never stop early: every response runs to --max-new-tokens
        model.lm_head.weight[[0, 3]] = 0.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def toy_prompts(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"tell me about the {TOY_WORDS[i % len(TOY_WORDS)]} number {i}."})
                            + "\n" for i in range(count)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="Target id/folder (default: a tiny random toy target).")
    parser.add_argument("--prompts", default=None, help="Prompts file (default: toy prompts).")
    parser.add_argument("--workdir", default="dflash-toy-run", help="Folder for data, checkpoints and the drafter.")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    if args.target is None:
        torch.set_num_threads(1)  # toy-sized tensors run fastest on one thread (and do not fight for shared cores)

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    target_name = args.target or str(toy_target(workdir / "toy-target"))
    prompts = args.prompts or str(toy_prompts(workdir / "prompts.jsonl", args.num_prompts))

    # 1. the target writes its own answers (resumable: rerun after a kill and it carries on)
    data = workdir / "train.jsonl"
    counts = regenerate(RegenerationArguments(target=target_name, prompts=prompts, output=str(data),
                                              max_new_tokens=args.max_new_tokens, batch_size=16,
                                              block_size=args.block_size, limit=args.num_prompts))
    print("regenerated:", counts)

    # 2. train against the frozen target (resume=True continues a killed run)
    training = DFlashTrainingArguments(target=target_name, data=str(data), output_dir=str(workdir / "drafter"),
                                       num_layers=args.num_layers, block_size=args.block_size, epochs=args.epochs,
                                       lr=args.lr, num_anchors=32, batch_size=2, eval_split=0.1, save_every=0,
                                       eval_max_new_tokens=args.max_new_tokens, resume=True)
    trainer = DFlashTrainer(training)
    results = trainer.train()

    # 3. compare with an untrained drafter on the same held-out prompts, both through real generate()
    target, _ = load_target(target_name)
    torch.manual_seed(0)
    untrained = DFlashDraftModel.from_target(target, num_hidden_layers=args.num_layers, block_size=args.block_size)
    baseline = measure_acceptance_length(target, untrained, trainer.eval_prompt_ids(), args.max_new_tokens)["tau"]
    print(f"acceptance length tau: untrained {baseline:.2f} -> trained {results.get('tau', float('nan')):.2f} "
          f"(held-out expected {results['heldout'].get('acceptance_length', float('nan')):.2f})")
    print(f"drafter saved to {training.output_dir}")


if __name__ == "__main__":
    main()
