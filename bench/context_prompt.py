"""A prompt of about N tokens for a tokenizer, so a decode benchmark runs at a chosen context.

    python3 bench/context_prompt.py N TOKENIZER_JSON      # prints the prompt (one line)

The prompt is one word repeated; its length is scaled from the tokenizer's count of a sample and then
trimmed until it encodes to at most N tokens (a model's template or special tokens may add a few).
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer


def prompt(n: int, tokenizer: Tokenizer, word: str = "x") -> str:
    sample = 1000
    per_word = len(tokenizer.encode(" ".join([word] * sample)).ids) / sample
    count = max(1, int(n / per_word))
    while count > 1 and len(tokenizer.encode(" ".join([word] * count)).ids) > n:
        count -= max(1, count // 200)
    return " ".join([word] * count)


def main() -> None:
    if len(sys.argv) != 3 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        print("usage: context_prompt.py N TOKENIZER_JSON (N >= 1)", file=sys.stderr)
        sys.exit(2)
    try:
        tokenizer = Tokenizer.from_file(sys.argv[2])
    except Exception as e:  # noqa: BLE001 - a missing or damaged file: say which, in one line
        print(f"context_prompt.py: cannot read the tokenizer {sys.argv[2]}: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    print(prompt(int(sys.argv[1]), tokenizer))


if __name__ == "__main__":
    main()
