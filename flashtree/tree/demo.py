"""`python -m flashtree.tree.demo`: build a vote tree from candidate blocks and verify it against a target choice."""

import torch

from . import build_vote_tree, commit_plan, verify_greedy


def main() -> None:
    cands = torch.tensor([[[11, 12, 13, 14], [11, 12, 15, 16], [11, 17, 18, 19], [11, 12, 13, 20]]])
    tree = build_vote_tree(cands, width=8)
    print("candidates (N=4, K=4):", cands[0].tolist())
    print("tree tokens :", tree.tokens[0].tolist())
    print("tree parents:", tree.parents[0].tolist())
    print("tree votes  :", tree.votes[0].tolist())
    target = torch.full((1, tree.width), 0)
    target[0, 0], target[0, 1], target[0, 2], target[0, 5] = 11, 12, 15, 16  # the target follows candidate 1
    res = verify_greedy(tree, target)
    print("accepted path:", res.path[0].tolist(), "committed:", res.tokens[0].tolist())
    print("req_to_token permutation:", commit_plan(tree, res).permutation[0].tolist())


if __name__ == "__main__":
    main()
