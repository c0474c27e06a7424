"""Admission: requests the tree path cannot serve are refused on arrival with a clear error; the server keeps serving.

Every request reaches the waiting queue through `Scheduler._add_request_to_queue` (new requests, and grammar requests
once their grammar compiled), so the check lives there: an unsupported request is finished with sglang's own abort
(`Req.set_finish_with_abort`, HTTP 400 `BadRequestError`) before sglang queues it, exactly as sglang's own request
validation does; nothing else in the batch changes.
"""

from __future__ import annotations

from .toggles import TOGGLES, TREE_N, TreeToggles

PREFIX = "flashtree"


def unsupported_reason(req, toggles: TreeToggles, serves_logprobs: bool = True) -> str | None:
    """Why the tree path cannot serve `req` (None = it can). Grammars, penalties, logit_bias, min_p and custom logit
    processors are served (decode.py, node_logits.py), return_logprob wherever the server's worker lets it reach the
    tree step (logprobs.py)."""
    if getattr(req, "return_logprob", False) and not serves_logprobs:
        what = ("return_logprob on a DFLASH server with this sglang release (its DFLASH worker refuses it; DSPARK "
                "servers serve it, and sglang 0.5.20 and 0.5.23 DFLASH ones)")
    elif getattr(req, "return_hidden_states", False):
        what = "return_hidden_states"
    elif getattr(req, "return_sampling_mask", False):  # the tree step builds no sampling-mask output
        what = "return_sampling_mask"
    else:
        return None
    return (
        f"{PREFIX}: this server runs flashtree tree speculative decoding (FLASHTREE_TREE_N={TOGGLES[TREE_N].parse.show(toggles.tree_n)}), which "
        f"cannot serve {what}. Send the request without it, or use a server started without FLASHTREE_TREE_N."
    )


def make_add_request_to_queue(original, toggles: TreeToggles, dspark_only_logprobs: bool = False):
    """`dspark_only_logprobs`: the release serves return_logprob on DSPARK servers only (logprobs.py)."""

    def _add_request_to_queue(self, req, is_retracted: bool = False):
        # Retracted requests were admitted before; already-finished ones carry their own error.
        if not is_retracted and getattr(req, "to_finish", None) is None and getattr(req, "finished_reason", None) is None:
            algorithm = getattr(self, "spec_algorithm", None)
            serves = not dspark_only_logprobs or bool(algorithm is not None and algorithm.is_dspark())
            reason = unsupported_reason(req, toggles, serves)
            if reason is not None:
                req.set_finish_with_abort(reason)
        return original(self, req, is_retracted)

    return _add_request_to_queue
