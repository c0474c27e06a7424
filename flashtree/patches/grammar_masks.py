"""Grammar-constrained requests on the tree step: each node's vocabulary mask from the grammar state of its own
root-to-node path, built on the host while the target verifies.

sglang's own builder (`spec_utils.build_grammar_vocab_mask`, which DSPARK's chain and EAGLE's trees use) allocates and
fills a mask row for every node of every request of the batch, constrained or not, and walks each tree with torch
scalar indexing. Over a tree's 16-64 nodes per request that is host work the step's walk waits for: on the dev CPU
(2026-12-02; SmolLM2's tokenizer, the live mix's regex, 32 requests x 64 nodes, 10 of them constrained) 5-14 ms a step, 3.5 ms of
it the (2048, 1536) mask's allocation and fill alone, against a 5-9 ms step. Here only the constrained requests' rows
exist:
  1. `TreeGrammar.start` (before the target verify launch): those requests' parents and node tokens, one copy to the
     host, without a wait;
  2. `TreeGrammar.apply` (after it): each request's grammar walks its own tree depth-first (a node whose token its
     parent's row allows is accepted, its row filled, its children visited, the token rolled back) into a pinned
     buffer kept across steps, and the rows are applied to those requests' logits only.
A row the walk leaves unfilled (a node its parent's row forbids, a node below one, a node past the grammar's
termination) is all-allowed, as in sglang: the walk never accepts a node whose token its parent's row masks, and a
request whose grammar terminated finishes at its stop token.

With FLASHTREE_GRAMMAR_OVERLAP=1 on a GPU, `apply` does not walk: it queues a wait on a pinned flag (host_flag.py)
before the masks' copy, the step queues its walk and commit behind it, and `finish` then waits for the nodes,
walks into the buffer and releases the flag, while the device runs the target verify. Elsewhere (CPU, a driver without
stream memory operations) `apply` waits for the nodes' copy and walks before the masks' copy.

The buffer is written only after this step's tree copy is done, which the stream orders after the previous step's
mask copy from it: one buffer is enough.
"""

from __future__ import annotations

import numpy as np
import torch

from flashtree.tree.encode import with_root
from flashtree.tree.types import VoteTree

from .host_copy import HostCopy

INVALID = -2  # a padding node's parent in the host copy


class MaskBuffer:
    """The pinned host rows of the constrained nodes' masks, grown to the largest step seen, in the grammar backend's
    own layout (`allocate_vocab_mask`'s row shape and dtype): a 32-bit bitmask of allowed tokens (xgrammar,
    llguidance) or one bool per token, True where forbidden (outlines)."""

    def __init__(self):
        self.rows: torch.Tensor | None = None
        self.vocab_size = 0

    def take(self, grammar, rows: int, vocab_size: int) -> torch.Tensor:
        if self.rows is None or self.rows.shape[0] < rows or self.vocab_size != vocab_size:
            layout = grammar.allocate_vocab_mask(vocab_size=vocab_size, batch_size=1, device="cpu")
            if layout.dtype not in (torch.int32, torch.bool):
                raise ValueError(f"flashtree: no tree grammar masks for {type(grammar).__name__}'s {layout.dtype} "
                                 "masks (32-bit bitmasks or bool masks)")
            self.vocab_size = vocab_size
            self.rows = torch.empty((max(rows, 2 * getattr(self.rows, "shape", (0,))[0]), layout.shape[1]),
                                    dtype=layout.dtype, pin_memory=torch.cuda.is_available())
        return self.rows[:rows]


class TreeGrammar:
    """One tree step's grammar masks (None from `start` when no request of the batch has a grammar)."""

    def __init__(self, constrained: list[int], grammars: list, nodes: HostCopy, index: torch.Tensor, width: int):
        self.constrained, self.grammars, self.nodes, self.index, self.width = constrained, grammars, nodes, index, width
        self.deferred: tuple | None = None  # (flag, ticket, barrier, rows, vocab_size) of a walk `finish` owes

    @classmethod
    def start(cls, reqs, tree: VoteTree, ids_2d: torch.Tensor) -> "TreeGrammar | None":
        constrained = [b for b, req in enumerate(reqs) if getattr(req, "grammar", None) is not None]
        if not constrained:
            return None
        index = torch.tensor(constrained, dtype=torch.long)
        if ids_2d.is_cuda:  # pinned: a pageable source may make the copy wait for the stream
            index = index.pin_memory().to(ids_2d.device, non_blocking=True)
        parents = torch.where(with_root(tree.valid, True), with_root(tree.parents, -1), INVALID)
        nodes = torch.stack([parents, ids_2d.to(parents.dtype)]).index_select(1, index)
        return cls(constrained, [reqs[b].grammar for b in constrained], HostCopy(nodes), index, ids_2d.shape[1])

    def walk(self, rows: torch.Tensor, vocab_size: int, barrier=None) -> None:
        """Fill the constrained requests' (len(constrained) * W, words) host rows; `barrier` first advances every
        request's grammar over the previous step's committed tokens (the walk starts from that state)."""
        if barrier is not None:
            barrier()
        nodes = self.nodes.wait().numpy()
        for r, grammar in enumerate(self.grammars):
            walk_tree(grammar, nodes[0, r], nodes[1, r], rows[r * self.width:(r + 1) * self.width], vocab_size)

    def apply(self, logits: torch.Tensor, buffer: MaskBuffer, sampling_info, barrier=None, flag=None) -> None:
        """Mask the constrained requests' rows of the step's (bs * W, V) logits in place. With `flag`
        (host_flag.HostFlag) the rows are filled by `finish`, which the stream waits for."""
        logits = logits.view(-1, logits.shape[-1])
        vocab_size = sampling_info.vocab_size
        rows = buffer.take(self.grammars[0], len(self.constrained) * self.width, vocab_size)
        if flag is None:
            self.walk(rows, vocab_size, barrier)
        else:
            self.deferred = (flag, flag.wait(logits.device), barrier, rows, vocab_size)
        rows = rows.to(logits.device, non_blocking=True)
        sampling_info.grammar_mask = None  # as sglang's builder: no stale extend-stage mask applied later
        grammar = self.grammars[0]  # the backend's apply: any one of the batch's grammar objects
        bs = logits.shape[0] // self.width
        if len(self.constrained) == bs:
            grammar.apply_vocab_mask(logits=logits, vocab_mask=rows)
            return
        view = logits.view(bs, self.width, -1)
        picked = view.index_select(0, self.index).view(-1, logits.shape[-1])
        grammar.apply_vocab_mask(logits=picked, vocab_mask=rows)
        view.index_copy_(0, self.index, picked.view(len(self.constrained), self.width, -1))

    def finish(self) -> None:
        """The walk `apply` deferred, if any: the barrier, the nodes' wait, the walk, then the flag's release, which
        happens however this exits (the stream waits for it)."""
        if self.deferred is None:
            return
        flag, ticket, barrier, rows, vocab_size = self.deferred
        self.deferred = None
        try:
            self.walk(rows, vocab_size, barrier)
        finally:
            flag.release(ticket)


def walk_tree(grammar, parents: np.ndarray, tokens: np.ndarray, rows: torch.Tensor, vocab_size: int) -> None:
    """Fill `rows` (W, mask row): node i's row the mask after its path's tokens (node 0, the root, after the committed
    ones); the grammar ends in the state it started in."""
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for node in range(1, len(parents)):
        if parents[node] >= 0:
            children[int(parents[node])].append(node)
    words = rows.numpy()
    bits = rows.dtype == torch.int32
    filled = np.zeros(len(parents), dtype=bool)
    stack = [] if grammar.is_terminated() else [(0, False)]  # (node, leaving it)
    while stack:
        node, leaving = stack.pop()
        if leaving:
            grammar.rollback(1)
            continue
        if node:
            token, row = int(tokens[node]), words[parents[node]]
            allowed = token < vocab_size and (
                (int(row[token >> 5]) >> (token & 31)) & 1 if bits else not row[token])
            if not allowed:
                continue  # forbidden at its parent: never accepted, nor anything below it
            grammar.accept_token(token)
            stack.append((node, True))
        if not grammar.is_terminated():
            grammar.fill_vocab_mask(rows, node)
            filled[node] = True
            stack.extend((child, False) for child in reversed(children[node]))
    words[~filled] = -1 if bits else False  # all allowed
