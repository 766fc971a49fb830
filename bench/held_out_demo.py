"""A held-out prompt set for smollm-cpu, written for this benchmark (not taken from any public set):
24 HumanEval-style function stubs and 10 MT-Bench-style questions, as `specpilot workloads
held-out add` reads them.

    python bench/held_out_demo.py OUT.jsonl && specpilot workloads held-out add OUT.jsonl -d smollm-cpu

It stands in for an operator's own prompts (a sample of real traffic) in docs/BENCHMARKS.md,
"Held-out prompts": a candidate that ships answers to the public sets gains nothing on it. Being
in this repository, it is not secret from anyone who reads the repository; an operator's own
set would be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specpilot.deployments.workloads.sources import CODE

STUBS = [
    (
        "running_max",
        "xs: list[int]) -> list[int]",
        "The maximum of xs[:i+1] for every i.",
        "running_max([1, 3, 2, 5]) == [1, 3, 3, 5]",
    ),
    (
        "count_vowels",
        "s: str) -> int",
        "How many of the characters of s are vowels (a, e, i, o, u, either case).",
        "count_vowels('Banana') == 3",
    ),
    (
        "rotate_left",
        "xs: list, k: int) -> list",
        "xs rotated k places to the left; k may exceed len(xs).",
        "rotate_left([1, 2, 3, 4], 1) == [2, 3, 4, 1]",
    ),
    (
        "is_anagram",
        "a: str, b: str) -> bool",
        "Whether a and b use the same letters the same number of times, ignoring spaces and case.",
        "is_anagram('Dormitory', 'dirty room') is True",
    ),
    (
        "digit_product",
        "n: int) -> int",
        "The product of the decimal digits of the non-negative integer n.",
        "digit_product(234) == 24",
    ),
    (
        "pairs_with_sum",
        "xs: list[int], target: int) -> int",
        "How many pairs i < j have xs[i] + xs[j] == target.",
        "pairs_with_sum([1, 2, 3, 4, 3], 6) == 2",
    ),
    (
        "compress_runs",
        "s: str) -> str",
        "Each run of a repeated character written as the character and the run's length.",
        "compress_runs('aaabcc') == 'a3b1c2'",
    ),
    (
        "second_largest",
        "xs: list[int]) -> int | None",
        "The second largest distinct value, or None when there is none.",
        "second_largest([4, 1, 4, 3]) == 3",
    ),
    (
        "title_words",
        "s: str) -> str",
        "Every word of s with its first letter upper case and the rest lower case.",
        "title_words('hELLO wORLD') == 'Hello World'",
    ),
    (
        "merge_sorted",
        "a: list[int], b: list[int]) -> list[int]",
        "The sorted merge of two sorted lists, without calling sort.",
        "merge_sorted([1, 4], [2, 3, 5]) == [1, 2, 3, 4, 5]",
    ),
    (
        "balanced",
        "s: str) -> bool",
        "Whether the brackets (), [] and {} in s are balanced and properly nested.",
        "balanced('{[()]}') is True",
    ),
    (
        "chunk",
        "xs: list, n: int) -> list[list]",
        "xs cut into consecutive pieces of n items; the last may be shorter.",
        "chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]",
    ),
    (
        "to_binary",
        "n: int) -> str",
        "The binary digits of the non-negative integer n, without a prefix.",
        "to_binary(10) == '1010'",
    ),
    (
        "mode",
        "xs: list[int]) -> int",
        "The most frequent value of xs; among ties, the smallest.",
        "mode([3, 1, 3, 1, 2]) == 1",
    ),
    (
        "flatten_once",
        "xs: list) -> list",
        "A list of lists flattened by one level.",
        "flatten_once([[1, 2], [3], []]) == [1, 2, 3]",
    ),
    (
        "caesar",
        "s: str, k: int) -> str",
        "s with every letter shifted k places through the alphabet, keeping case; other characters unchanged.",
        "caesar('Abz', 1) == 'Bca'",
    ),
    (
        "gcd_list",
        "xs: list[int]) -> int",
        "The greatest common divisor of all the positive integers in xs.",
        "gcd_list([12, 18, 24]) == 6",
    ),
    (
        "unique_in_order",
        "xs: list) -> list",
        "xs with consecutive duplicates removed.",
        "unique_in_order([1, 1, 2, 2, 1]) == [1, 2, 1]",
    ),
    (
        "word_lengths",
        "s: str) -> dict[str, int]",
        "Each distinct word of s mapped to its length.",
        "word_lengths('to be or') == {'to': 2, 'be': 2, 'or': 2}",
    ),
    (
        "matrix_transpose",
        "m: list[list[int]]) -> list[list[int]]",
        "The transpose of a rectangular matrix.",
        "matrix_transpose([[1, 2], [3, 4], [5, 6]]) == [[1, 3, 5], [2, 4, 6]]",
    ),
    (
        "is_power_of_three",
        "n: int) -> bool",
        "Whether n is 3 to some non-negative integer power.",
        "is_power_of_three(27) is True",
    ),
    (
        "longest_word",
        "s: str) -> str",
        "The longest word of s; the first one among ties.",
        "longest_word('a bb ccc dd') == 'ccc'",
    ),
    (
        "sum_of_squares_odd",
        "n: int) -> int",
        "The sum of the squares of the odd numbers from 1 to n inclusive.",
        "sum_of_squares_odd(5) == 35",
    ),
    (
        "interleave",
        "a: str, b: str) -> str",
        "The characters of a and b taken in turn; what is left of the longer one at the end.",
        "interleave('abc', 'xy') == 'axbyc'",
    ),
]

QUESTIONS = [
    "Explain to a new gardener how to decide when tomatoes need watering.",
    "Write a short, friendly email asking a neighbour to keep their dog off the shared lawn.",
    "Compare taking the train and flying for a 500 km trip: time, cost and comfort.",
    "Describe three ways a small bakery could cut its energy bill this winter.",
    "What should someone check before buying a second-hand bicycle?",
    "Summarize the rules of chess for a ten-year-old in one paragraph.",
    "Suggest a weekly study plan for learning basic Spanish in three months.",
    "Why does bread go stale, and how can it be kept fresh longer?",
    "Write a four-line poem about the first snow in a quiet town.",
    "Give advice to a team lead whose meetings always run over time.",
]


def rows() -> list[dict]:
    out = []
    for name, sig, doc, example in STUBS:
        stub = f'def {name}({sig}:\n    """{doc}\n    >>> {example}\n    """\n'
        out.append({"set": "humaneval", "id": name, "prompt": CODE.format(stub.strip())})
    out += [{"set": "mtbench", "id": f"q{i}", "prompt": q} for i, q in enumerate(QUESTIONS)]
    return out


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("".join(json.dumps(r) + "\n" for r in rows()))
