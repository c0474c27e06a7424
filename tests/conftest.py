import pytest
import torch

_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def _threads(request):
    """Tiny models run fastest on one thread (thread hand-offs cost more than their matmuls); the real model
    (tests marked slow) gets every core."""
    torch.set_num_threads(_THREADS if request.node.get_closest_marker("slow") else 1)
    yield
