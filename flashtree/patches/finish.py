"""Stop tokens in a speculative step that reaches max_new_tokens (sglang 0.5.17's `Req.update_finish_state`).

A speculative step appends several tokens at once, then calls `update_finish_state(new_accepted_len)`. sglang 0.5.17
checks the length limit before anything else, so when a step both accepts a stop token and reaches max_new_tokens,
the request finishes by length and keeps the tokens after its stop token. One-token decoding would have stopped at
that token. Live, this was the one difference left between speculative and plain greedy outputs: an end-of-turn token
at position 126 of 128, then one more token. 0.5.20 checks stops first and caps at the limit afterwards.

The wrapper below checks the accepted tokens that one-token steps would have checked (those that left the output below
the limit) for stop tokens with sglang's own `_check_token_based_finish`, then falls through to sglang. Stop strings
keep sglang's 0.5.17 handling.
"""

from __future__ import annotations


def make_update_finish_state(original):
    def update_finish_state(self, new_accepted_len: int = 1):
        limit = self.sampling_params.max_new_tokens
        total = len(self.output_ids)
        if new_accepted_len > 1 and limit is not None and total >= limit and not self.finished() and not self.to_finish:
            before = total - new_accepted_len  # the output's length before this step
            checked = limit - 1 - before  # tokens whose one-token step left the output below the limit
            if checked > 0:
                full = self.output_ids
                self.output_ids = full[: before + checked]  # sglang's check locates the stop from the output's end
                try:
                    stopped = self._check_token_based_finish(list(self.output_ids[before:]))
                finally:
                    self.output_ids = full
                if stopped:
                    return
        return original(self, new_accepted_len)

    return update_finish_state
