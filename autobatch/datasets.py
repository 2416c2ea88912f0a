"""The benchmark data: SST trees and WikiNER sentences from ``../shared/data`` when present,
else synthetic data with the same statistics (nothing is downloaded)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

def _data_dir() -> Path:
    """Where the shared data lives: $AUTOBATCH_DATA, else ../shared/data beside the repository
    (an editable install), else beside the working directory (any install, run from the repo)."""
    if "AUTOBATCH_DATA" in os.environ:
        return Path(os.environ["AUTOBATCH_DATA"])
    candidates = [Path(__file__).resolve().parents[2] / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    return next((c for c in candidates if c.is_dir()), candidates[0])


DATA_DIR = _data_dir()


@dataclass
class Tree:
    """A binary sentiment tree: a leaf has a word, an internal node two children."""

    label: int
    word: str | None = None
    left: Tree | None = None
    right: Tree | None = None

    @property
    def is_leaf(self) -> bool:
        return self.word is not None

    def nodes(self) -> list[Tree]:
        """Every node, children before parents (left subtree, right subtree, node)."""
        order, stack = [], [self]
        while stack:  # a node, then its right and left subtrees, reversed at the end
            node = stack.pop()
            order.append(node)
            if node.word is None:
                stack += (node.left, node.right)
        order.reverse()
        return order

    def leaves(self) -> list[Tree]:
        return [n for n in self.nodes() if n.is_leaf]


def parse_tree(line: str) -> Tree:
    """Parse ``(label child child)`` / ``(label word)`` bracketed SST trees."""
    tokens = line.replace("(", " ( ").replace(")", " ) ").split()
    position = 0

    def node() -> Tree:
        nonlocal position
        if tokens[position] != "(":
            raise ValueError(f"expected '(' at token {position} of {line[:60]!r}")
        label = int(tokens[position + 1])
        position += 2
        if tokens[position] != "(":
            word = tokens[position]
            position += 2  # the word and its ')'
            return Tree(label, word=word)
        left, right = node(), node()
        if tokens[position] != ")":
            raise ValueError(f"SST trees are binary: {line[:60]!r}")
        position += 1
        return Tree(label, left=left, right=right)

    return node()


def synthetic_tree(rng: random.Random, vocabulary: int = 2000) -> Tree:
    """A random binary tree with SST's leaf count statistics (mean about 19, max 52)."""
    n_leaves = max(1, min(52, int(rng.gammavariate(3.0, 6.4))))

    def build(n: int) -> Tree:
        if n == 1:
            return Tree(rng.randrange(5), word=f"w{rng.randrange(vocabulary)}")
        left = rng.randint(1, n - 1)
        return Tree(rng.randrange(5), left=build(left), right=build(n - left))

    return build(n_leaves)


def sst_trees(split: str = "train", limit: int | None = None, seed: int = 0) -> tuple[list[Tree], str]:
    """Trees and where they came from (the file, or 'synthetic')."""
    path = DATA_DIR / "sst" / f"{split}.txt"
    if path.is_file():
        with open(path) as f:
            lines = [line for line, _ in zip(f, range(limit if limit is not None else 1 << 60))]
        return [parse_tree(line) for line in lines if line.strip()], str(path)
    rng = random.Random(seed)
    return [synthetic_tree(rng) for _ in range(limit or 8544)], "synthetic"


def wikiner_sentences(limit: int | None = None, seed: int = 0) -> tuple[list[list[tuple[str, str]]], str]:
    """Sentences as (word, tag) pairs, and where they came from."""
    path = DATA_DIR / "wikiner" / "dev.txt"
    if path.is_file():
        sentences = []
        with open(path) as f:
            for line in f:
                tokens = [t.rsplit("|", 1) for t in line.split()]
                if tokens:
                    sentences.append([(w, tag) for w, tag in tokens])
                if limit is not None and len(sentences) >= limit:
                    break
        return sentences, str(path)
    rng = random.Random(seed)
    tags = ["O"] * 8 + ["I-PER", "I-ORG", "I-LOC", "I-MISC"]
    sentences = []
    for _ in range(limit or 1696):
        length = max(1, min(144, int(rng.gammavariate(2.5, 9.2))))  # mean about 23
        sentences.append([(f"w{rng.randrange(5000)}", rng.choice(tags)) for _ in range(length)])
    return sentences, "synthetic"
