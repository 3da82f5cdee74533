"""A key/value cache is handed to a model under the name its forward declares (sapo_node.shared_prefix):
transformers 5.24 renamed `past_key_values` to `cache` and warns at every call with the old name."""

from __future__ import annotations

import inspect
import warnings

import torch

from sapo_node.shared_prefix import returned_cache, with_cache


def test_the_cache_goes_under_the_name_the_forward_declares(tiny_mini_policy):
    model, _ = tiny_mini_policy
    for forward in (model, model.base_model):
        (name,) = with_cache(forward, None)
        assert name in inspect.signature(type(forward).forward).parameters


def test_a_pass_on_a_returned_cache_warns_nothing_and_continues_the_sequence(tiny_mini_policy):
    model, _ = tiny_mini_policy
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        head = model(input_ids=ids[:, :4], use_cache=True)
        rest = model(input_ids=ids[:, 4:], use_cache=True, **with_cache(model, returned_cache(head)))
        whole = model(input_ids=ids).logits
    assert torch.allclose(rest.logits, whole[:, 4:], atol=1e-5)
